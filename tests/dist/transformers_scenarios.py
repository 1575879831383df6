"""Worker for tests/dist/test_transformers.py: Hugging Face models built from a config
(no download), trained on 2 gloo ranks through Phalanx's public API. Every strategy runs
on the one process group (swapped in with `sharded_scenarios.using`).

Rank 0 saves each run's gathered weights, losses and probe logits to OUT/<name>.pt; the
exports are OUT/export-<model>-<strategy>/; the checkpoints OUT/ckpt-<model>-<strategy>/.
Usage: python transformers_scenarios.py OUT
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import torch
import transformers
from sharded_scenarios import using  # beside this file (a script's folder is on sys.path)
from torch.distributed.fsdp import FSDPModule
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import phalanx
from phalanx.errors import UserError

VOCAB, SEQ, GLOBAL, ACCUM, STEPS, SAVE_AT, CLIP = 64, 16, 4, 2, 4, 2, 1.0
# AdamW turns the noise of a gradient that is exactly zero in exact arithmetic (GPT-2's key
# bias: softmax ignores it) into steps of up to ~lr/10 whose sign depends on the summation
# order; at LR the largest such difference stays below the tests' 1e-5 (bf16: a faster LR)
LR, BF16_LR = 1e-3, 1e-2
STRATEGIES = ("ddp", "zero", "fsdp")
RESUMES = (("ddp", "ddp"), ("zero", "zero"), ("fsdp", "fsdp"), ("ddp", "fsdp"))
EXPORTS = (("gpt2", "fsdp"), ("llama", "fsdp"), ("gpt2", "ddp"))
SPECIAL = {"bos_token_id": 0, "eos_token_id": 0}  # inside the vocabulary


def gpt2_config(n_layer: int = 2) -> GPT2Config:
    return GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      tie_word_embeddings=True, **SPECIAL)


def llama_config() -> LlamaConfig:
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                       max_position_embeddings=32, attention_dropout=0.0, **SPECIAL)


MODELS = {"gpt2": (GPT2LMHeadModel, gpt2_config), "llama": (LlamaForCausalLM, llama_config)}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The same initial weights on every rank (FSDP shards them; it broadcasts nothing)."""
    cls, config = MODELS[name]
    torch.manual_seed(seed)
    return cls(config())


def tokens(step: int) -> torch.Tensor:
    """Step `step`'s global batch: GLOBAL sequences of SEQ random tokens."""
    return torch.randint(0, VOCAB, (GLOBAL, SEQ), generator=torch.Generator().manual_seed(step))


PROBE = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(99))


def micro_batches(step: int, rank: int, world: int) -> list[torch.Tensor]:
    """This rank's contiguous share of the global batch, in ACCUM micro-batches."""
    per = GLOBAL // world
    return list(tokens(step)[rank * per:(rank + 1) * per].chunk(ACCUM))


def train(run, model, opt, first: int, last: int) -> list[float]:
    """Steps first..last-1: accumulate ACCUM micro-batches, clip, step; the global losses."""
    acc = run.accumulate(model, ACCUM)
    losses = []
    for step in range(first, last):
        total = 0.0
        for x in micro_batches(step, run.rank, run.world_size):
            x = x.to(run.device)
            with acc.micro_step(), run.precision.autocast():
                loss = model(input_ids=x, labels=x).loss
                acc.backward(loss)
            total += loss.item() / ACCUM
        assert acc.boundary
        run.clip_grad_norm_(model, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(run.all_reduce_mean(total))
    return losses


def reference(name: str) -> dict:
    """One process, no Phalanx: the same global batches, the same clip and AdamW."""
    model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x = tokens(step)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "losses": losses}


def setup(run, name: str, seed: int = 0, precision: str = "fp32", lr: float = LR):
    """run.setup of a fresh model; rank 0's stderr while it ran (Phalanx's note)."""
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        model, opt = run.setup(build(name, seed), lambda p: torch.optim.AdamW(p, lr=lr),
                               precision=precision)
    return model, opt, said.getvalue()


def finish(run, model, extra: dict, path: Path) -> None:
    """Rank 0 saves the gathered weights, the probe's logits and `extra` to `path`."""
    state = run.full_state_dict(model)
    with torch.no_grad():
        logits = model(input_ids=PROBE.to(run.device)).logits.float().cpu()
    if run.is_main:
        torch.save({"state": {k: v.clone() for k, v in state.items()}, "logits": logits,
                    **extra}, path)
    run.barrier()


def straight(run, name: str, label: str, out: Path) -> None:
    """STEPS steps, with a checkpoint after SAVE_AT; FSDP: which modules it sharded."""
    with using(run, label):
        model, opt, said = setup(run, name)
        losses = train(run, model, opt, 0, SAVE_AT)
        run.save(out / f"ckpt-{name}-{label}", SAVE_AT, model, opt)
        losses += train(run, model, opt, SAVE_AT, STEPS)
        sharded = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        extra = {"losses": losses, "said": said, "sharded": sharded}
        if (name, label) in EXPORTS:
            returned = run.export(model, out / f"export-{name}-{label}")
            extra["returned"] = run.gather_objects(None if returned is None else str(returned))
        finish(run, model, extra, out / f"{name}-{label}.pt")


def resumed(run, name: str, first: str, then: str, out: Path) -> None:
    """A fresh model (other weights) under `then` loads `first`'s checkpoint; the rest."""
    with using(run, then):
        model, opt, _ = setup(run, name, seed=123)
        run.load(out / f"ckpt-{name}-{first}" / f"step-{SAVE_AT:08d}", model, opt)
        losses = train(run, model, opt, SAVE_AT, STEPS)
        finish(run, model, {"losses": losses}, out / f"{name}-{first}-to-{then}.pt")


def no_blocks(run, out: Path) -> None:
    """A 1-layer GPT-2 (no repeated block) under FSDP: sharded as one unit, and said."""
    with using(run, "fsdp"):
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            torch.manual_seed(0)
            model, opt = run.setup(GPT2LMHeadModel(gpt2_config(n_layer=1)),
                                   lambda p: torch.optim.AdamW(p, lr=LR))
        losses = train(run, model, opt, 0, 2)
        sharded = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        if run.is_main:
            torch.save({"said": said.getvalue(), "sharded": sharded, "losses": losses},
                       out / "no-blocks.pt")


def export_refused(run, out: Path) -> None:
    """Rank 0 cannot write the export (the place holds other files): every rank raises,
    none is left waiting. Each rank's message: OUT/occupied-rank<R>.txt."""
    if run.is_main:
        (out / "occupied").mkdir()
        (out / "occupied" / "notes.txt").write_text("not an export")
    run.barrier()
    with using(run, "fsdp"):
        model, _, _ = setup(run, "gpt2")
        try:
            run.export(model, out / "occupied")
            said = "no error"
        except UserError as exc:
            said = str(exc)
    (out / f"occupied-rank{run.rank}.txt").write_text(said)


def bf16(run, out: Path) -> None:
    """bf16 autocast (FSDP: its bf16 policy): the same batch again and again."""
    for name, label in (("gpt2", "ddp"), ("gpt2", "fsdp"), ("llama", "fsdp")):
        with using(run, label):
            model, opt, _ = setup(run, name, precision="bf16", lr=BF16_LR)
            losses = []
            for _ in range(6):
                losses += train(run, model, opt, 0, 1)
            if run.is_main:
                torch.save({"losses": losses}, out / f"bf16-{name}-{label}.pt")


def main(out: Path) -> None:
    transformers.logging.set_verbosity_error()  # its notes on configs built from scratch
    transformers.logging.disable_progress_bar()
    with phalanx.init(seed=0) as run:
        for name in MODELS:
            if run.is_main:
                torch.save(reference(name), out / f"{name}-reference.pt")
            for label in STRATEGIES:
                straight(run, name, label, out)
            for first, then in RESUMES:
                resumed(run, name, first, then, out)
        no_blocks(run, out)
        export_refused(run, out)
        bf16(run, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
