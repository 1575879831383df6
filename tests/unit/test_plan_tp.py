"""`phalanx plan --tp T` (issue 44, plan for every built layout): one tensor-parallel
rank's split of MiniGPT (phalanx.plan.tensor_parallel) under FSDP over the dp_shard ranks.
`--measure` checks it against torch's memory tracker on 4 gloo ranks
(tests/e2e/test_plan_layouts.py); these check the arithmetic and the refusals."""

from __future__ import annotations

import pytest

from phalanx import cli
from phalanx.config.flags import resolve
from phalanx.models.shapes import minigpt_layout, numel
from phalanx.plan import estimate
from phalanx.plan import formulas as f
from phalanx.plan.recommend import comm_passes, facts_for
from phalanx.plan.tensor_parallel import block_activations, local_layout, tp_comm_bytes


def config(*argv: str):
    ns = cli.build_parser().parse_args(["plan", "--n-layer", "2", "--n-embd", "64",
                                        "--n-head", "2", "--block-size", "64", *argv])
    return resolve(ns)


def test_a_tp_rank_holds_its_split_of_the_matrices_and_the_whole_of_the_rest():
    C, V = 64, 4096
    whole = minigpt_layout(2, C, V, 64, False, rope=True, tied=False)
    local = local_layout(whole, 2, V, C)
    split = (C * C + 4 * C * C + 4 * C * C) // 2  # c_proj, c_fc, mlp.c_proj: halves
    kept = 3 * C * C + 2 * C  # c_attn and the norms: whole
    assert sum(map(numel, local.block)) == split + kept
    assert local.embeddings == [(V // 2, C)] and local.tail == [(C,), (V // 2, C)]
    # a vocabulary T does not divide stays whole (no loss_parallel)
    odd = local_layout(minigpt_layout(2, C, V + 1, 64, False), 2, V + 1, C)
    assert odd.embeddings[0] == (V + 1, C)
    # learned positions as many as the vocabulary (bytes, block size 256): wpe stays whole
    wpe = local_layout(minigpt_layout(2, C, 256, 256, False, tied=True), 2, 256, C)
    assert wpe.embeddings == [(128, C), (256, C)] and wpe.tail == [(C,)]


def test_the_tp_row_is_fsdp_over_dp_shard_of_the_split_model():
    cfg = config("--optimizer", "adamw")
    v, fsdp = estimate.mesh_variant(1, 2, tp=2), estimate.VARIANTS[2]
    assert v.label == "tp 2 × dp_shard 2" and v.shard_ranks(4) == 2
    assert v.layout == {"dp_shard": -1, "tp": 2}
    assert estimate.mesh_variant(2, 2, 2).layout == {"dp_replicate": 2, "dp_shard": -1, "tp": 2}
    tp, whole = facts_for(cfg, variant=v), facts_for(cfg, variant=fsdp)
    ratio = f.param_bytes(tp.param_shapes) / f.param_bytes(whole.param_shapes)
    assert 0.5 < ratio < 0.75, ratio  # c_attn and the norms stay whole
    peak_tp = estimate.peak(tp, v, 4, False)
    peak_fsdp = estimate.peak(whole, fsdp, 2, False)
    assert peak_tp["optimizer"] < peak_fsdp["optimizer"]
    assert peak_tp["activations"] < peak_fsdp["activations"]


def test_tp_activations_count_the_split_and_the_whole_parts():
    B, T, C, H = 4, 64, 64, 4
    unit = B * T * C * f.FP32
    stats = 2 * 2 * B * T * f.FP32
    assert block_activations(B, T, C, H, 1, False) == 16 * unit + stats + B * H * T * 4
    assert block_activations(B, T, C, H, 2, True) == (4 + 7) * unit + stats + B * 2 * T * 4


def test_tp_all_reduces_are_exposed_communication():
    cfg = config("--optimizer", "adamw")
    v = estimate.mesh_variant(1, 2, tp=2)
    base = comm_passes(cfg, facts_for(cfg, variant=v), estimate.mesh_variant(1, 2), 2)
    with_tp = comm_passes(cfg, facts_for(cfg, variant=v), v, 4)
    extra = with_tp["exposed"] - base["exposed"]
    B = cfg.train.micro_batch_size
    act = B * 64 * 64 * 4
    gathers = 2 * f.ring_all_gather_bytes(3 * act, 2)  # the heads' gradients, per block
    assert extra == pytest.approx((3 * 2 + 2) * f.ring_all_reduce_bytes(act, 2) + gathers)
    assert tp_comm_bytes(cfg, 2, B, 4097) == pytest.approx(
        6 * f.ring_all_reduce_bytes(act, 2) + gathers)  # the vocabulary whole


@pytest.mark.parametrize("argv, said", [
    (["--precision", "bf16"], "`--precision bf16` is not fp32"),
    (["--qk-norm"], "`--qk-norm` is on"),
    (["--activation-checkpointing"], "`--activation-checkpointing` is on"),
    (["--n-head", "3", "--n-embd", "66"], "--n-head 3 does not divide into 2 tensor-parallel")])
def test_what_the_tp_model_does_not_cover_is_refused_in_one_line(argv, said, capsys):
    code = cli.main(["plan", "--world-size", "4", "--tp", "2", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err


def test_layouts_are_the_meshes_that_fit_the_machines():
    from phalanx.plan.layouts import candidates

    cfg = config("--n-head", "8", "--n-embd", "64")
    labels = [v.label for v in candidates(cfg, 64, 8)]
    assert labels == ["hsdp (8 × 8)", "tp 2 × hsdp (8 × 4)", "tp 4 × hsdp (8 × 2)",
                      "tp 8 × hsdp (8 × 1)"]
    # one machine: FSDP over the data-parallel ranks; a TP size the heads refuse is left out
    one = [v.label for v in candidates(config("--n-head", "2"), 8, 8)]
    assert one == ["tp 2 × dp_shard 4"]
    # an option the TP model does not cover: HSDP only
    assert [v.label for v in candidates(config("--qk-norm", "--n-head", "8"), 64, 8)] == \
        ["hsdp (8 × 8)"]


def test_the_recommendation_proposes_a_layout_and_says_why_tp_is_not_needed(capsys):
    """A 6.5 B MiniGPT on 64 H100 (8 per machine): every layout fits; FSDP without reshard
    is fastest, and the sentence gives the best TP layout's time for the same batch."""
    import json

    argv = ["plan", "--gpu", "h100", "--world-size", "64", "--nproc-per-node", "8",
            "--layouts", "--n-layer", "32", "--n-embd", "4096", "--n-head", "32",
            "--block-size", "4096", "--micro-batch-size", "1", "--optimizer", "adamw",
            "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {r["strategy"]: r for r in result["rows"]}
    assert {"hsdp (8 × 8)", "tp 2 × hsdp (8 × 4)", "tp 8 × hsdp (8 × 1)"} <= set(rows)
    said = result["recommendation"]
    assert said.startswith("fsdp (no reshard): it fits"), said
    tp2 = rows["tp 2 × hsdp (8 × 4)"]["time"]["step_s"]
    assert f"tp 2 × hsdp (8 × 4), takes {tp2 * 2 * 1e3:.1f} ms for the same global batch" \
        in said, said
    # a TP step is compared at T steps: its own step is shorter than fsdp's
    assert tp2 < rows["fsdp"]["time"]["step_s"] < 2 * tp2


def test_layouts_with_a_named_layout_or_measure_is_one_line(capsys):
    for extra, said in ((["--dp-shard", "2"], "leave out layout flags"),
                        (["--dp-shard", "-1"], "leave out layout flags"),  # a 1-D row
                        (["--measure"], "leave out --measure")):
        code = cli.main(["plan", "--world-size", "4", "--layouts", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and said in err[0], err


def test_a_tp_rank_computes_its_split_of_the_matrices():
    cfg = config("--optimizer", "adamw")
    v = estimate.mesh_variant(1, 2, tp=2)
    whole = facts_for(cfg, variant=estimate.VARIANTS[2]).flops_per_token
    split = facts_for(cfg, variant=v).flops_per_token
    assert 0.5 * whole < split < 0.75 * whole  # c_attn whole on every rank
