"""The layouts of a device mesh on 4 gloo ranks (tests/dist/mesh_scenarios.py is the
worker, one launch for every case): ddp (dp_replicate 4), fsdp (dp_shard 4), HSDP
(dp_replicate 2 × dp_shard 2), and tensor parallelism inside FSDP2 (tp 2 × dp_shard 2,
tp 2 × dp_replicate 2).

Tolerance, derived here: plain ddp already differs from the one-process run of the same
global batch by float summation order; each layout may differ from the one-process run
by at most 10 × that (a bug — a wrong shard, a missed reduction over a mesh dimension,
replicas fed the same data — moves weights by 1e-3 or more after 3 AdamW steps).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.data.corpus import prepare
from phalanx.launch.agent import launch_workers
from phalanx.train.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from mesh_scenarios import GLOBAL, LAYOUTS, MUON, config, kinds_of, start  # noqa: E402

SCRIPT = str(Path(__file__).parent / "mesh_scenarios.py")
FLOOR = 1e-6  # fp32: if ddp happened to equal one process bit for bit, 10 × 0 is no bound


@pytest.fixture(scope="module")
def mesh(tmp_path_factory, corpus_file, cache_dir):
    pytest.importorskip("transformers", reason="transformers is not installed (the `test` "
                        "extra has it: pip install -c constraints.txt -e '.[test]')")
    out = tmp_path_factory.mktemp("mesh")
    launch_workers([SCRIPT, str(out), str(corpus_file), str(cache_dir)], 4, threads=1)
    return out


@pytest.fixture(scope="module")
def one_rank(mesh, corpus_file, cache_dir, tmp_path_factory):
    """The one-process runs: the start weights, 3 steps of the global batch, and the resume
    chain's last hop (from the HSDP hop's step 6 to 8)."""
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    out = tmp_path_factory.mktemp("one")
    with phalanx.init(seed=7, threads=1) as run:
        start(run, out)
        result = train(config(3, micro=GLOBAL), run, splits)
        eq = {"state": run.full_state_dict(result.model), "losses": result.losses}
        result = train(config(3, micro=GLOBAL, optimizer="muon"), run, splits)
        muon = {"state": run.full_state_dict(result.model), "losses": result.losses}
        where = out / "last-hop"
        checkpoint = mesh / "hop2-hsdp" / "checkpoints" / "step-00000006"
        result = train(config(8, where, str(checkpoint), micro=GLOBAL), run, splits, where)
        hop = {"state": run.full_state_dict(result.model), "losses": result.losses,
               "step": result.state.step, "position": result.state.position}
    return {"out": out, "eq": eq, "muon": muon, "hop": hop}


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def tolerance(mesh, one_rank) -> tuple[float, float]:
    """(ddp's difference from one process, the bound derived from it)."""
    ddp = max_difference(load(mesh / "eq-ddp.pt")["state"], one_rank["eq"]["state"])
    return ddp, max(10 * ddp, FLOOR)


@pytest.mark.parametrize(("label", "kind"),
                         [(label, kind) for label in LAYOUTS for kind in kinds_of(label)])
def test_weights_after_setup_equal_the_one_rank_run(mesh, one_rank, label, kind):
    one = load(one_rank["out"] / f"start-single-{kind}.pt")
    got = load(mesh / f"start-{label}-{kind}.pt")
    assert sorted(got) == sorted(one)
    differ = [k for k in one if not torch.equal(got[k], one[k])]
    assert not differ, f"{label}: {differ} differ from the one-rank run"
    if kind.startswith("minigpt"):  # the head tied to the embedding, built on meta too
        assert torch.equal(got["wte.weight"], got["lm_head.weight"]), label


@pytest.mark.parametrize("label", list(LAYOUTS))
def test_each_layout_equals_one_process_on_the_same_global_batch(mesh, one_rank, label):
    ddp, bound = tolerance(mesh, one_rank)
    found = load(mesh / f"eq-{label}.pt")
    difference = max_difference(found["state"], one_rank["eq"]["state"])
    print(f"{label}: {difference:.3g} from one process (ddp: {ddp:.3g}, bound {bound:.3g})")
    assert difference <= bound, (label, difference, ddp)
    assert found["losses"] == pytest.approx(one_rank["eq"]["losses"], rel=1e-5), label


@pytest.mark.parametrize("label", [m for m in MUON if m != "ddp"])
def test_muon_under_a_mesh_equals_one_process(mesh, one_rank, label):
    """Muon orthogonalises whole matrices: under HSDP and tensor parallelism each update
    is gathered over every mesh dimension, and the result is one process's (the bound
    derived from ddp's)."""
    ddp = max_difference(load(mesh / "muon-ddp.pt")["state"], one_rank["muon"]["state"])
    found = load(mesh / f"muon-{label}.pt")
    difference = max_difference(found["state"], one_rank["muon"]["state"])
    print(f"muon {label}: {difference:.3g} from one process (ddp: {ddp:.3g})")
    assert difference <= max(10 * ddp, FLOOR), (difference, ddp)
    assert found["losses"] == pytest.approx(one_rank["muon"]["losses"], rel=1e-5)
    assert max_difference(found["state"], one_rank["eq"]["state"]) > 1e-3  # not AdamW's


def test_resume_across_layouts_lands_where_the_arithmetic_says(mesh, one_rank):
    """tp 2 × dp_shard 2 → dp_shard 4 → HSDP 2×2 → one rank, each hop from the last one's
    checkpoint (DCP reshards the split matrices into whole ones and back):
    each equal to the uninterrupted HSDP run at that step, its data cursor at step ×
    the global batch (the same samples, whatever the layout)."""
    _, bound = tolerance(mesh, one_rank)
    straight = load(mesh / "straight.pt")
    hops = [load(mesh / f"hop{h}.pt") for h in range(3)] + [one_rank["hop"]]
    for h, hop in enumerate(hops):
        end = 2 * h + 2
        assert hop["step"] == end and hop["position"] == end * GLOBAL, (h, hop["step"])
        assert hop["losses"] == pytest.approx(straight["losses"][end - 2:end], rel=1e-5), h
        at = straight if end == 8 else load(mesh / f"straight-{end}.pt")
        assert at["step"] == end
        difference = max_difference(hop["state"], at["state"])
        print(f"hop {h} (to step {end}): {difference:.3g} from the straight run (bound "
              f"{bound:.3g})")
        assert difference <= bound, h
    assert max_difference(straight["state"], load(mesh / "straight-6.pt")["state"]) > 1e-3


def one_process(model: torch.nn.Module) -> tuple[dict, list[float]]:
    """The scripted cases' loop in plain torch, one process on the whole batch: the
    weights and losses after 3 clipped AdamW steps."""
    from mesh_scenarios import llama_batch
    from transformers_scenarios import LR

    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(3):
        x = llama_batch(step)
        loss = model(input_ids=x, labels=x)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return model.state_dict(), losses


def compare_scripted(mesh, name: str, label: str, model: torch.nn.Module) -> dict:
    found = load(mesh / f"{name}-{label}.pt")
    state, losses = one_process(model)
    difference = max_difference(found["state"], {k: v for k, v in state.items()
                                                 if k in found["state"]})
    print(f"{name} {label}: {difference:.3g} from one process")
    assert difference < 1e-5 and found["losses"] == pytest.approx(losses, rel=1e-5)
    return found


@pytest.mark.parametrize("label", ["hsdp", "tp-shard"])
def test_a_transformers_llama_in_a_script_equals_one_process(mesh, label):
    """Plain torch in one process on the whole batch against the script's own loop under
    HSDP, and under tp 2 × dp_shard 2 with the tensor-parallel plan Llama's config ships,
    on 4 ranks; its save_pretrained export loads with from_pretrained, bit for bit."""
    from mesh_scenarios import llama_for_tp
    from transformers import LlamaForCausalLM
    from transformers_scenarios import build

    found = compare_scripted(mesh, "llama", label,
                             llama_for_tp() if label == "tp-shard" else build("llama"))
    loaded = LlamaForCausalLM.from_pretrained(mesh / f"llama-{label}-export").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in found["state"].items())


def test_a_scripts_own_tensor_parallel_plan_equals_one_process(mesh):
    """run.setup(model, tp_plan={"up": "colwise", "down": "rowwise"}) on a script's own
    model (no plan of its own) under tp 2 × dp_shard 2, against one process."""
    from mesh_scenarios import ScriptLM

    placed = compare_scripted(mesh, "script", "tp-shard", ScriptLM())["placed"]
    print(placed)  # e.g. up.weight ['_S(0, 2)', 'S(0)']: (dp_shard, tp)
    assert len(placed["up.weight"]) == 2 and placed["up.weight"][-1] == "S(0)"  # by columns
    assert len(placed["down.weight"]) == 2 and placed["down.weight"][-1] == "S(1)"  # by rows
    assert len(placed["head.weight"]) == 1  # not in the plan: on the dp mesh alone


def test_an_hsdp_replica_changed_on_one_rank_is_named(mesh):
    messages = {(mesh / f"guard-rank{r}.txt").read_text() for r in range(4)}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert "`blocks.1.weight (shard)` differs on rank(s) 2 from rank(s) 0" in message, message


def test_tensor_parallel_dropout_masks_are_shared_and_forked_where_the_docs_say(mesh):
    """tp groups {0, 1} and {2, 3}: on replicated activations (the residual dropout) the
    ranks of a group draw the same mask and the two data-parallel ranks different ones;
    inside attention (each rank's own heads) the ranks of a group draw different
    numbers; after it, the shared stream is in step again."""
    import json

    seen = json.loads((mesh / "masks.json").read_text())
    residual, core, after = ([s[k] for s in seen] for k in ("residual", "core", "after"))
    assert residual[0] == residual[1] and residual[2] == residual[3], residual
    assert residual[0] != residual[2], residual
    assert core[0] != core[1] and core[2] != core[3], core
    assert after[0] == after[1] and after[2] == after[3] and after[0] != after[2], after


def test_a_tensor_parallel_ranks_copy_of_a_whole_tensor_changed_is_named(mesh):
    """c_attn stays whole on each rank of a tp group (FSDP shards it over dp_shard): rank
    1's copy changed, rank 0 (its tp peer) holds the other."""
    messages = {(mesh / f"guard-tp-rank{r}.txt").read_text() for r in range(4)}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert "`blocks.0.attn.c_attn.weight (shard)` differs on rank(s) 1 from rank(s) 0" in \
        message, message
    assert "across the tensor-parallel group" in message, message


@pytest.fixture(scope="module")
def eight(tmp_path_factory, corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("eight")
    launch_workers([SCRIPT, str(out), str(corpus_file), str(cache_dir)], 8, threads=1)
    return out


@pytest.mark.full
def test_eight_ranks_every_dimension_at_once(eight, one_rank, corpus_file, cache_dir,
                                             tmp_path):
    """dp_replicate 2 × dp_shard 2 × tp 2 on 8 gloo ranks: the weights after setup are
    the one-rank run's; 3 steps of the global batch equal one process within 10 × ddp's
    difference on the same 8 ranks; its step-2 checkpoint resumed on one rank lands on
    the one-process run, the cursor at 3 × the global batch."""
    ddp = max_difference(load(eight / "eq-ddp-8.pt")["state"], one_rank["eq"]["state"])
    bound = max(10 * ddp, FLOOR)
    start_one = load(one_rank["out"] / "start-single-minigpt.pt")
    start_3d = load(eight / "start-3d-minigpt.pt")
    assert all(torch.equal(start_3d[k], v) for k, v in start_one.items())
    found = load(eight / "eq-3d.pt")
    difference = max_difference(found["state"], one_rank["eq"]["state"])
    assert found["losses"] == pytest.approx(one_rank["eq"]["losses"], rel=1e-5)
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    checkpoint = eight / "3d" / "checkpoints" / "step-00000002"
    with phalanx.init(seed=7, threads=1) as run:
        result = train(config(3, tmp_path, str(checkpoint), micro=GLOBAL), run, splits, tmp_path)
        resumed = run.full_state_dict(result.model)
    after = max_difference(resumed, one_rank["eq"]["state"])
    print(f"8 ranks: 3d {difference:.3g} from one process, resumed on one rank {after:.3g} "
          f"(ddp on 8: {ddp:.3g}, bound {bound:.3g})")
    assert difference <= bound and after <= bound
    assert result.state.step == 3 and result.state.position == 3 * GLOBAL


def test_an_output_fsdp2_cannot_hook_is_said_at_the_first_forward(mesh):
    """A forward that returns its loss in a SimpleNamespace: FSDP2 finds no tensor to hook
    its backward on, and the backward would fail with "setStorage: ... storage of size 0";
    every rank says why at the first forward instead."""
    for rank in range(4):
        said = (mesh / f"hidden-rank{rank}.txt").read_text()
        assert said.startswith("Namespaced's forward returned a SimpleNamespace holding "
                               "`loss`, a tensor that needs gradients"), said
        assert "Return a tensor, tuple, list or dict" in said


def test_the_vocabulary_is_split_and_the_loss_taken_on_the_shards(mesh):
    """MiniGPT under tp 2 × dp_shard 2: its tied embedding and head are one weight split
    over the vocabulary (rows; FSDP2's shard on top), the head's logits stay split over
    the vocabulary (Shard(2)) and the loss is a plain tensor; a plan that splits one of
    two tied names is refused in one line on every rank."""
    seen = json.loads((mesh / "vocab.json").read_text())
    assert seen["tied"] and seen["wte"][-1] == "S(0)", seen
    assert seen["logits"] == ["S(2)"] and seen["loss"] == "Tensor", seen
    for rank in range(4):
        said = (mesh / f"tied-rank{rank}.txt").read_text()
        assert said.startswith("`--tp 2`: `embed.weight` and `head.weight` are one tied "
                               "weight, and the tensor-parallel plan splits them "
                               "differently"), said
