"""Worker for tests/dist/test_mesh.py: the layouts of a device mesh on 4 gloo ranks (and
the one-rank reference at 1), every case on one process group, each layout's mesh built
for its case.

- start: the weights right after setup, each rank's generator drawing differently first,
  for every layout and model kind it takes (tensor parallelism: MiniGPT, the model with a
  plan, built on the CPU and on the meta device) (rank 0 saves
  OUT/start-<layout>-<kind>.pt);
- train: 3 AdamW steps of the same global batch (8 sequences) under each layout (OUT/
  eq-<layout>.pt: full weights, losses, gradient norms), the consistency check every step;
  and 3 Muon steps under ddp, HSDP and tp 2 × dp_shard 2 (OUT/muon-<layout>.pt);
- chain: 8 steps straight under HSDP (checkpoints every 2), and a resume chain that
  changes the layout at each checkpoint (tp 2 × dp_shard 2 → dp_shard 4 → HSDP 2×2, the
  global batch kept; the test ends it on one rank);
- scripted: a transformers Llama in a script's own loop under HSDP and under tp 2 ×
  dp_shard 2 (the plan its config ships), exported with save_pretrained (OUT/llama-
  <layout>.pt, OUT/llama-<layout>-export/); and a script's own model under tp 2 × dp_shard
  2 with the plan the script gives run.setup (OUT/script-tp-shard.pt);
- masks: dropout under tp 2 × dp_shard 2: which masks the ranks of a tp group share;
- guard: one HSDP replica's shard changed on one rank: the consistency check names it;
- hidden: FSDP2 and a forward whose output hides its loss from torch's pytree;
- vocab: MiniGPT's vocabulary split under tp (loss parallel), and a tied pair split one way;
- eight (on 8 ranks instead of all the above): dp_replicate 2 × dp_shard 2 × tp 2 at once.
Usage: python mesh_scenarios.py OUT CORPUS CACHE
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
from sharded_scenarios import CLIP, TINY  # noqa: F401  (the same tiny model and clip)
from start_scenarios import KINDS

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.models.minigpt import GPTConfig, MiniGPT
from phalanx.strategies import build, choose_for_script
from phalanx.strategies.topology import data_parallel
from phalanx.train.loop import train

# label: (strategy, layout keywords) on 4 ranks
LAYOUTS = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "hsdp": (None, {"dp_replicate": 2, "dp_shard": 2}),
    "tp-shard": (None, {"tp": 2, "dp_shard": 2}),
    "tp-replicate": (None, {"tp": 2, "dp_replicate": 2}),
}
# on 8 ranks (the opt-in case): every dimension at once, and ddp's derived scale
EIGHT = {"ddp-8": ("ddp", {}), "3d": (None, {"dp_replicate": 2, "dp_shard": 2, "tp": 2})}
TP = ("tp-shard", "tp-replicate", "3d")  # (only models with a tensor-parallel plan: MiniGPT)
def minigpt_on_meta() -> torch.nn.Module:
    with torch.device("meta"):  # (as `phalanx train --model` builds one)
        return MiniGPT(GPTConfig(vocab_size=64, **TINY))


START_KINDS = {**KINDS, "minigpt": lambda: MiniGPT(GPTConfig(vocab_size=64, **TINY)),
               "minigpt_meta": minigpt_on_meta}
MUON = ("ddp", "hsdp", "tp-shard")


def kinds_of(label: str) -> list[str]:
    """The model kinds layout `label` is set up with at the start."""
    return ["minigpt", "minigpt_meta"] if label in TP else list(START_KINDS)
CHAIN = ("tp-shard", "fsdp", "hsdp")  # the layout of each hop: steps 0-2, 2-4, 4-6
GLOBAL = 8


def config(steps: int, out: Path | None = None, resume: str = "never", micro: int = 2,
           optimizer: str = "adamw"):
    return build_config({
        "model": {**TINY, "dropout": 0.0},
        "train": {"micro_batch_size": micro, "grad_accum": 1, "max_steps": steps,
                  "lr_decay_steps": 8, "warmup_steps": 1, "eval_every": 1000,
                  "eval_batches": 1, "lr": 3e-3, "min_lr": 3e-4, "seed": 7,
                  "grad_clip": CLIP, "log_every": 1, "checkpoint_every": 2,
                  "keep_checkpoints": 4, "resume": resume, "out": str(out or "unused"),
                  "sample_tokens": 0, "optimizer": optimizer, "muon_lr": 0.05},
        "dist": {"check_consistency_every": 1}})


@contextlib.contextmanager
def laid_out(run, label: str):
    """The run with layout `label`'s strategy, on a mesh built for it (and, with tensor
    parallelism, the data-parallel rank and size it sets)."""
    name, dims = {**LAYOUTS, **EIGHT}[label]
    choice = choose_for_script(name, run.world_size, **dims)
    topology = run.topology
    if choice.spec.sharded:  # (as phalanx.init builds it: the mesh, the data-parallel rank)
        t = topology
        topology = data_parallel(t.rank, t.local_rank, t.world_size, t.local_world_size,
                                 t.device, t.backend, t.launcher, layout=choice.layout,
                                 peers=t.peers)
    saved = run.strategy, run.topology
    run.strategy, run.topology = build(choice, topology), topology
    try:
        yield run.strategy
    finally:
        run.strategy, run.topology = saved


def dump(run, result, path: Path) -> None:
    weights = run.full_state_dict(result.model)
    if run.is_main:
        torch.save({"state": {k: v.detach().clone() for k, v in weights.items()},
                    "losses": result.losses, "step": result.state.step,
                    "position": result.state.position,
                    "norms": [float(n) for n in result.grad_norms]}, path)
    run.barrier()


def start(run, out: Path, labels: list[str] | None = None) -> None:
    labels = labels or (["single"] if run.world_size == 1 else list(LAYOUTS))
    for label in labels:
        for kind in kinds_of(label):
            make = START_KINDS[kind]
            torch.manual_seed(1000 + run.rank)  # every rank draws differently
            with (laid_out(run, label) if label != "single" else
                  contextlib.nullcontext(run.strategy)) as strategy:
                wrapped = strategy.setup_module(make(), strategy.precision("fp32"))
                full = strategy.full_state_dict(wrapped)
            if run.is_main:
                torch.save({k: v.detach().clone().cpu() for k, v in full.items()},
                           out / f"start-{label}-{kind}.pt")


def equivalence(run, splits, out: Path) -> None:
    for label in LAYOUTS:
        with laid_out(run, label):
            dump(run, train(config(3, micro=GLOBAL // run.topology.dp_size), run, splits),
                 out / f"eq-{label}.pt")
    for label in MUON:  # Muon gathers each matrix over every mesh dimension
        with laid_out(run, label):
            dump(run, train(config(3, micro=GLOBAL // run.topology.dp_size, optimizer="muon"), run, splits),
                 out / f"muon-{label}.pt")


def eight(run, splits, out: Path) -> None:
    """8 ranks: the start weights under dp_replicate 2 × dp_shard 2 × tp 2, then 3 steps
    of the global batch under it (checkpointed at step 2, which the test resumes on one
    rank) and under ddp (the derived scale)."""
    start(run, out, ["3d"])
    for label in EIGHT:
        where = out / label
        with laid_out(run, label):
            dump(run, train(config(3, where, micro=GLOBAL // run.topology.dp_size), run,
                            splits, where), out / f"eq-{label}.pt")


def chain(run, splits, out: Path) -> None:
    with laid_out(run, "hsdp"):
        where = out / "straight"
        dump(run, train(config(8, where, micro=GLOBAL // 4), run, splits, where),
             out / "straight.pt")
        for step in (2, 4, 6):  # the straight run's weights there: loaded, no step taken
            checkpoint = str(where / "checkpoints" / f"step-{step:08d}")
            again = out / f"straight-at-{step}"
            dump(run, train(config(step, again, checkpoint, micro=GLOBAL // 4), run, splits,
                            again), out / f"straight-{step}.pt")
    resume = "never"
    for hop, label in enumerate(CHAIN):
        where = out / f"hop{hop}-{label}"
        with laid_out(run, label):
            result = train(config(2 * hop + 2, where, resume, micro=GLOBAL // run.topology.dp_size),
                           run, splits, where)
            dump(run, result, out / f"hop{hop}.pt")
        resume = str(where / "checkpoints" / f"step-{2 * hop + 2:08d}")


def llama_batch(step: int) -> torch.Tensor:
    """Step `step`'s global batch for the Llama case: 8 sequences of 16 random tokens."""
    from transformers_scenarios import VOCAB

    return torch.randint(0, VOCAB, (GLOBAL, 16), generator=torch.Generator().manual_seed(step))


def llama_for_tp() -> torch.nn.Module:
    """The test's Llama with as many key/value heads as heads (2): tp 2 splits both."""
    from transformers import LlamaForCausalLM
    from transformers_scenarios import llama_config

    config = llama_config()
    config.num_key_value_heads = 2
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


class ScriptLM(torch.nn.Module):
    """A script's own model with no plan of its own: the script hands run.setup one
    (`SCRIPT_PLAN`); called as transformers models are, its loss under "loss" (in a dict:
    FSDP2 finds the tensors to hook for the backward only in what torch's pytree opens)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(64, 16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.head = torch.nn.Linear(16, 64)

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        logits = self.head(x + self.down(torch.nn.functional.gelu(self.up(x))))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss}


SCRIPT_PLAN = {"up": "colwise", "down": "rowwise"}


def scripted(run, out: Path, name: str, label: str = "hsdp") -> None:
    """A script's own loop under `label` (phalanx.init's keywords through `laid_out`):
    `name` "llama", a transformers Llama (under tp: the plan its config ships), or
    "script", `ScriptLM` with the plan the script gives run.setup; 3 clipped AdamW steps,
    each rank on its data-parallel share, then `run.export` (save_pretrained for Llama)."""
    from transformers_scenarios import LR, build

    with laid_out(run, label):
        make = {"llama": llama_for_tp if label in TP else lambda: build("llama"),
                "script": ScriptLM}[name]
        model, opt = run.setup(make(), lambda p: torch.optim.AdamW(p, lr=LR),
                               tp_plan=SCRIPT_PLAN if name == "script" else None)
        t = run.topology
        per = GLOBAL // t.dp_size
        placed = {n: [str(x) for x in getattr(p, "placements", ())]
                  for n, p in model.named_parameters()}  # (how each parameter was split)
        losses = []
        for step in range(3):
            x = llama_batch(step)[t.dp_rank * per:(t.dp_rank + 1) * per]
            loss = model(input_ids=x, labels=x)["loss"]
            loss.backward()
            run.clip_grad_norm_(model, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(run.all_reduce_mean(loss.item()))
        state = run.full_state_dict(model)
        if name == "llama":
            run.export(model, out / f"{name}-{label}-export")
    if run.is_main:
        torch.save({"state": {k: v.clone() for k, v in state.items()}, "losses": losses,
                    "placed": placed}, out / f"{name}-{label}.pt")


def masks(run, out: Path) -> None:
    """Dropout under tp 2 × dp_shard 2 (tp groups {0, 1} and {2, 3}): each rank's mask on
    the residual dropout (replicated activations), a draw inside the attention core (its
    own heads: its own stream) and a draw after the forward (the shared stream), gathered
    into OUT/masks.json by rank."""
    import hashlib
    import json

    import torch.distributed as dist

    seen: dict[str, str] = {}

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.detach().cpu().numpy().tobytes()).hexdigest()[:16]

    with laid_out(run, "tp-shard") as strategy:
        torch.manual_seed(1000 + run.rank)  # every rank draws differently before setup
        model = strategy.setup_module(MiniGPT(GPTConfig(vocab_size=64, dropout=0.5, **TINY)),
                                      strategy.precision("fp32"))
        attn = model.blocks[0].attn
        attn.resid_dropout.register_forward_hook(
            lambda m, i, o: seen.__setitem__("residual", digest(o == 0)))
        attn.core.register_forward_pre_hook(  # (after the style's: inside the fork)
            lambda m, i: seen.__setitem__("core", digest(torch.rand(16))))
        run.seed_step(0)
        model(torch.arange(32).reshape(2, 16) % 64)
        seen["after"] = digest(torch.rand(16))
    every: list = [None] * run.world_size
    dist.all_gather_object(every, seen)
    if run.is_main:
        (out / "masks.json").write_text(json.dumps(every))


def guard(run, out: Path) -> None:
    """Rank 2 (replica set {0, 2} under dp_replicate 2 × dp_shard 2) changes its shard."""
    from torch.distributed.tensor import DTensor

    with laid_out(run, "hsdp") as strategy:
        torch.manual_seed(5)
        model = strategy.setup_module(KINDS["own_init"](), strategy.precision("fp32"))
        strategy.check_consistency(model)  # as set up: replicas equal
        weight = model.blocks[1].weight
        assert isinstance(weight, DTensor)
        if run.rank == 2:
            with torch.no_grad():
                weight.to_local().add_(1.0)
        message = consistency_message(strategy, model)
    (out / f"guard-rank{run.rank}.txt").write_text(message)
    with laid_out(run, "tp-shard") as strategy:  # c_attn is whole on each tp rank
        model = strategy.setup_module(MiniGPT(GPTConfig(vocab_size=64, **TINY)),
                                      strategy.precision("fp32"))
        strategy.check_consistency(model)  # as set up: the tp group's copies equal
        if run.rank == 1:
            with torch.no_grad():
                model.blocks[0].attn.c_attn.weight.to_local().add_(1.0)
        message = consistency_message(strategy, model)
    (out / f"guard-tp-rank{run.rank}.txt").write_text(message)


class Namespaced(ScriptLM):
    """ScriptLM whose forward returns its loss in a SimpleNamespace."""

    def forward(self, input_ids, labels):
        from types import SimpleNamespace

        return SimpleNamespace(**super().forward(input_ids, labels))


def hidden(run, out: Path) -> None:
    """FSDP2 with a forward whose output hides its loss from torch's pytree: what the
    first forward says (OUT/hidden-rank<r>.txt)."""
    from phalanx.errors import UserError

    with laid_out(run, "fsdp") as strategy:
        model = strategy.setup_module(Namespaced(), strategy.precision("fp32"))
        x = llama_batch(0)[:2]
        try:
            model(input_ids=x, labels=x).loss.backward()
            said = "no error"
        except UserError as exc:
            said = str(exc)
    (out / f"hidden-rank{run.rank}.txt").write_text(said)


class TiedLM(ScriptLM):
    """ScriptLM whose head shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.head.weight = self.embed.weight


def vocab(run, out: Path) -> None:
    """Under tp 2 × dp_shard 2: MiniGPT's tied embedding and head split over the
    vocabulary as one weight, the head's logits left split, the loss taken on them under
    the strategy's loss context, forward and backward (OUT/vocab.json from rank 0); and a
    plan that splits one of two tied names refused (OUT/tied-rank<r>.txt)."""
    import json

    from torch.distributed.tensor import DTensor

    from phalanx.errors import UserError

    seen: dict = {}
    with laid_out(run, "tp-shard") as strategy:
        model = strategy.setup_module(MiniGPT(GPTConfig(vocab_size=64, **TINY)),
                                      strategy.precision("fp32"))
        model.lm_head.register_forward_hook(lambda m, i, o: seen.__setitem__(
            "logits", [str(p) for p in o.placements] if isinstance(o, DTensor) else "whole"))
        x = torch.arange(32).reshape(2, 16) % 64
        with strategy.loss_context():
            _, loss = model(x, x)
            loss.backward()
        seen["tied"] = model.wte.weight is model.lm_head.weight
        seen["wte"] = [str(p) for p in model.wte.weight.placements]
        seen["loss"] = type(loss).__name__
        try:
            strategy.setup_module(TiedLM(), strategy.precision("fp32"),
                                  tp_plan={"head": "colwise"})
            said = "no error"
        except UserError as exc:
            said = str(exc)
    if run.is_main:
        (out / "vocab.json").write_text(json.dumps(seen))
    (out / f"tied-rank{run.rank}.txt").write_text(said)


def consistency_message(strategy, model) -> str:
    """What the consistency check says of `model` ("no error" when it passes)."""
    from phalanx.errors import DistributedError

    try:
        strategy.check_consistency(model)
        return "no error"
    except DistributedError as exc:
        return str(exc)


def main(out: Path, corpus: str, cache: str) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    splits = prepare(corpus, cache, 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        if run.world_size == 8:
            return eight(run, splits, out)
        start(run, out)
        if run.world_size > 1:
            equivalence(run, splits, out)
            chain(run, splits, out)
            scripted(run, out, "llama")
            scripted(run, out, "llama", "tp-shard")
            scripted(run, out, "script", "tp-shard")
            masks(run, out)
            guard(run, out)
            hidden(run, out)
            vocab(run, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
