"""`phalanx plan --model pkg.module:factory`: the facts of a user's model, built on the
meta device (nothing allocated) — as `phalanx train --model` takes it (models.user): a
function that returns the module, traced on (micro-batch, block size) token ids, or
(module, example input), traced on the example remade at the planned micro-batch.

Parameters and FSDP's blocks come from the module itself (the same block detection as
the fsdp strategy, `strategies.blocks.find_blocks`). Activations are traced: one forward
on fake tensors (torch's FakeTensorMode: shapes and dtypes, nothing allocated) under
autograd's saved-tensor hooks adds up every tensor kept for backward (each storage once,
parameters excluded), plus the output. The trace follows the planned step:

- micro-batch: token ids are made at the planned micro-batch; an example tensor (or the
  tensors of an example tuple) is remade with dim 0 at the planned micro-batch, its
  dtype and other dims kept (the plan says when it did);
- precision: bf16/fp16 under ddp/zero trace inside `torch.autocast` over fp32 parameters
  (autocast's CPU op lists, on fake CPU tensors — CUDA's lists differ in a few ops); under
  fsdp the parameters and floating inputs are cast to 2 bytes first, as FSDP's
  mixed-precision policy gathers them;
- activation checkpointing: the trainer does not checkpoint a user's module
  (`--activation-checkpointing` is MiniGPT's and is refused with `--model`); a module that
  calls `torch.utils.checkpoint` itself is traced as it runs, keeping what it keeps.
  `checkpointed=True` traces every block `find_blocks` finds under non-reentrant
  `torch.utils.checkpoint` (what a checkpoint wrapper does): a block keeps its input, and
  one block's tensors of the plain trace are recomputed at a time in backward.

Activations are linear in the micro-batch: tracing at two sizes gives
saved(b) = a + c·b (a: what does not grow with the batch, such as autocast's weight
copies), which gives the largest micro-batch that fits. Compute is 3 × the forward's
FLOPs counted by torch's FlopCounterMode on the same trace (matmuls, convolutions and
SDPA attention, so attention is included when the model uses SDPA or matmuls); 6·N is
the fallback when it counts nothing. Less is known than for MiniGPT: the peak is taken at
the start of backward (saved tensors, the output and one output-sized gradient) or at the
optimizer step; this is not checked against measurement here.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from phalanx.errors import UserError
from phalanx.plan import formulas as f
from phalanx.plan.estimate import ModelFacts
from phalanx.plan.fake import fake_input, on_fake_cpu, quiet

LOW = {"bf16": "bfloat16", "fp16": "float16"}


class Trace(NamedTuple):
    """What one traced forward keeps, in bytes (and its FLOPs)."""
    saved: int  # every tensor kept for backward, each storage once, parameters excluded
    output: int  # the output the caller holds (the logits)
    flops: int  # the forward's, as FlopCounterMode counts them
    block_saved: int  # the most one block keeps (checkpointed: its input)
    block_input: int  # the largest block input


def _line(one: Trace, two: Trace, base: int, b: int) -> Trace:
    """The trace at b on the line through the traces at base and 2·base."""
    return Trace(*(x + (y - x) * (b - base) // base for x, y in zip(one, two)))._replace(
        flops=one.flops * b // base)


@dataclass
class UserModel:
    """A user's model, built once on the meta device; `facts(b, sharded)` traces it (cached)
    at micro-batch b, in the planned precision."""
    spec: str
    model: Any
    example: Any  # the factory's example, or None (token ids of (b, block_size))
    block_size: int
    precision: str
    shapes: list[tuple[int, ...]]
    copies: tuple[int, ...]
    groups: tuple[int, ...]
    block_shapes: list[tuple[int, ...]]
    root_shapes: list[tuple[int, ...]]
    n_blocks: int
    example_batch: int | None  # dim 0 of the factory's example (None: token ids, or unscalable)
    planned: int = 1  # the micro-batch traced first (the plan's)
    vocab_size: int = 256
    scalable: bool = True
    checkpointed: bool = False  # every block under torch.utils.checkpoint (see `trace`)
    unfused_step: bool = False  # Muon's per-parameter step (estimate.ModelFacts')
    traced: dict = field(default_factory=dict)  # (b, low params, checkpointed) → Trace

    @property
    def n_params(self) -> int:
        return sum(map(f.numel, self.shapes))

    def tokens(self, b: int) -> int:
        """Tokens per micro-batch: b·T for token ids (B, T); else b samples."""
        x = self.inputs(b)[0] if self.inputs(b) else None
        return b * x.shape[1] if x is not None and _is_ids(x) else b

    def inputs(self, b: int) -> tuple:
        import torch

        if self.example is None:
            return (torch.zeros((b, self.block_size), dtype=torch.long, device="meta"),)
        items = self.example if isinstance(self.example, (tuple, list)) else (self.example,)
        return tuple(_remade(x, b) if self.scalable else x for x in items)

    def trace_at(self, b: int, low_params: bool, checkpointed: bool = False) -> Trace:
        key = (b, low_params, checkpointed)
        if key not in self.traced:
            lm = self.vocab_size if self.example is None else None  # the trainer's call
            self.traced[key] = trace(self.model, self.inputs(b), self.spec, self.precision,
                                     low_params, lm_vocab=lm, checkpointed=checkpointed)
        return self.traced[key]

    def traced_at(self, b: int, low: bool, checkpointed: bool = False) -> Trace:
        """The trace at b: on the line through two traces when the example scales
        (a + c·b), so any b costs two traces."""
        base = self.planned if self.scalable else b
        one = self.trace_at(base, low, checkpointed)
        if not self.scalable or b == base:
            return one
        return _line(one, self.trace_at(2 * base, low, checkpointed), base, b)

    def facts(self, b: int, sharded: bool = False) -> ModelFacts:
        """ModelFacts at micro-batch b; `sharded`: FSDP's (2-byte gathered parameters
        under bf16/fp16). Without checkpointing, every saved tensor counts at backward's
        start; with it, each block keeps its input and one block's tensors are recomputed
        at a time (`estimate.moments`)."""
        low = sharded and self.precision in LOW
        t = self.traced_at(b, low)
        tokens = self.tokens(b)
        per_token = -(-3 * t.flops // tokens) if t.flops else 6 * self.n_params
        # the trainer's fp32 cross-entropy: its two B·T·V gradients at backward's start
        # (token ids); on an example the loss is unknown: one output-sized gradient
        grads = 2 * tokens * self.vocab_size * f.FP32 if self.example is None else t.output
        blocks = {"block_saved": 0, "block_input": 0, "head_saved": t.saved}
        if self.checkpointed and self.n_blocks:
            ck = self.traced_at(b, low, checkpointed=True)
            blocks = {"block_saved": t.block_saved, "block_input": ck.block_input,
                      "head_saved": max(0, ck.saved - self.n_blocks * ck.block_input)}
        return ModelFacts(self.shapes, self.block_shapes, self.root_shapes, self.n_blocks,
                          block_saved=blocks["block_saved"],
                          block_input=blocks["block_input"], head_saved=blocks["head_saved"],
                          logits=t.output, loss_grads=grads,
                          block_grads_in_flight=0, flops_per_token=per_token,
                          tokens=tokens, gathered=2 if low else f.FP32,
                          state_copies=self.copies, optim_groups=self.groups,
                          unfused_step=self.unfused_step)

    def flops_note(self, b: int) -> str:
        counted = self.traced_at(b, False).flops
        first = self.inputs(1)
        unit = "token" if first and _is_ids(first[0]) else "sample"
        six = f"6·N = {6 * self.n_params / 1e6:,.2f} MFLOP/{unit}"
        if not counted:
            return (f"compute: 6·N per {unit} (torch's FlopCounterMode counted no FLOPs in "
                    f"the forward; attention, if any, not included)")
        return (f"compute: 3 × the forward's FLOPs counted by torch's FlopCounterMode "
                f"(matmuls, convolutions, SDPA attention) = "
                f"{self.facts(b).flops_per_token / 1e6:,.2f} MFLOP/{unit} ({six})")

    def scale_note(self, b: int) -> str | None:
        if self.example is None:
            return None
        if not self.scalable:
            return ("your example is traced as given (it is not a tensor or tuple of "
                    "tensors with the batch on dim 0): the planned micro-batch is not applied "
                    "and the largest micro-batch is not predicted")
        if self.example_batch != b:
            return (f"your example's dim 0 ({self.example_batch}) was remade at the planned "
                    f"micro-batch {b} (same dtype and other dims)")
        return None


def _is_ids(x) -> bool:
    import torch

    return isinstance(x, torch.Tensor) and x.dim() == 2 and not x.is_floating_point()


def _remade(x, b: int):
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    return torch.zeros((b, *x.shape[1:]), dtype=x.dtype, device="meta")


def _example_batch(example) -> int | None:
    """dim 0 shared by every tensor of the example; None when it is not scalable."""
    import torch

    items = example if isinstance(example, (tuple, list)) else (example,)
    tensors = [x for x in items if isinstance(x, torch.Tensor)]
    if not tensors or any(x.dim() == 0 for x in tensors):
        return None
    sizes = {x.shape[0] for x in tensors}
    return sizes.pop() if len(sizes) == 1 else None


def load(spec: str, block_size: int | None, vocab_size: int = 256,
         optimizer: str = "adamw", precision: str = "fp32",
         micro_batch: int | None = None, checkpointed: bool = False) -> UserModel:
    """The factory's module on the meta device, its parameters, optimizer groups (with
    muon, the hidden matrices `runtime.muon.hidden_matrices` picks keep 1 state copy) and
    FSDP blocks. The factory is given `block_size=` and `vocab_size=` as `phalanx train`
    gives them."""
    import torch

    from phalanx.models.user import make_model
    from phalanx.strategies.blocks import find_blocks

    with torch.device("meta"):
        model, example = make_model(spec, vocab_size=vocab_size, block_size=block_size)
    if example is None and block_size is None:
        raise UserError(f"`--model {spec}` returned no example input: `phalanx plan` traces "
                        f"one forward to count activations. Return (model, example) from "
                        f"the factory, or give `--block-size`.")
    shapes, seen, copies, groups = [], set(), [], []
    hidden = set()
    if optimizer == "muon":
        from phalanx.runtime.muon import hidden_matrices

        hidden = hidden_matrices(model, vocab_size)
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            shapes.append(tuple(p.shape))
            muon = id(p) in hidden  # groups as runtime.optim builds them
            copies.append(f.MUON_COPIES if muon else f.ADAMW_COPIES)
            groups.append((0 if muon else 1 if p.dim() >= 2 else 2) if hidden
                          else 0 if p.dim() >= 2 else 1)
    blocks = find_blocks(model)
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    batch = _example_batch(example) if example is not None else None
    return UserModel(
        spec, model, example, block_size or 0, precision, shapes, tuple(copies),
        tuple(groups), [tuple(p.shape) for p in blocks[0].parameters()] if blocks else [],
        [tuple(p.shape) for p in dict.fromkeys(model.parameters()) if id(p) not in in_blocks],
        len(blocks), batch, planned=micro_batch or batch or 1, vocab_size=vocab_size,
        scalable=example is None or batch is not None, checkpointed=checkpointed,
        unfused_step=optimizer == "muon")


def user_facts(spec: str, batch: tuple[int, int] | None = None,
               vocab_size: int = 256, optimizer: str = "adamw") -> ModelFacts:
    """fp32 facts at (micro-batch, block size) (`load`, then `UserModel.facts`)."""
    user = load(spec, batch[1] if batch else None, vocab_size, optimizer,
                micro_batch=batch[0] if batch else None)
    return user.facts(user.planned)


def trace(model, inputs: tuple, spec: str, precision: str = "fp32",
          low_params: bool = False, lm_vocab: int | None = None,
          checkpointed: bool = False) -> Trace:
    """One forward on fake CPU tensors: under autocast for bf16/fp16 (`low_params`: the
    parameters and floating inputs cast to 2 bytes instead, as FSDP gathers them).
    `lm_vocab`: token ids in, traced as the trainer calls it — adapted
    (`models.adapter`), `logits, loss = model(x, y)`, its fp32 cross-entropy included;
    the output is then the logits. `checkpointed`: every block (`find_blocks`) run
    under `torch.utils.checkpoint` (non-reentrant), as a checkpoint wrapper would: a
    block then keeps only its input."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from phalanx.strategies.blocks import find_blocks

    low = getattr(torch, LOW[precision]) if precision in LOW else None
    kept: dict[int, int] = {}
    copied = _copy(model, spec)  # (outside the mode: a meta tensor copied inside it fails)
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = on_fake_cpu(copied, low if low_params else None)
        watch = _BlockWatch(find_blocks(fake), checkpointed)
        if lm_vocab is not None:
            from phalanx.models.adapter import adapt

            fake = adapt(fake, spec, lm_vocab)
        params = {p.untyped_storage()._cdata for p in fake.parameters()}
        xs = tuple(fake_input(x, low if low_params else None) for x in inputs)
        if lm_vocab is not None:
            xs = (*xs, torch.zeros_like(xs[0]))  # the targets

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage._cdata not in params and storage._cdata not in kept:
                kept[storage._cdata] = storage.nbytes()
                watch.add(storage.nbytes())
            return t

        cast = torch.autocast("cpu", dtype=low) if low is not None and not low_params \
            else contextlib.nullcontext()
        counter = FlopCounterMode(display=False)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast, \
                    counter, quiet("torch._subclasses.fake_tensor"):
                out = fake(*xs)
        except UserError:  # the adapter's own (logits of the wrong shape)
            raise
        except Exception as exc:  # the user's forward: say what it raised, in one line
            raise _forward_error(spec, exc) from None
        if lm_vocab is not None:  # (logits, loss): the caller holds the logits
            out = out[0]
        outs = out if isinstance(out, (tuple, list)) else (getattr(out, "logits", out),)
        output = sum(o.untyped_storage().nbytes() for o in outs if isinstance(o, torch.Tensor))
    return Trace(sum(kept.values()), output, counter.get_total_flops(),
                 max(watch.saved, default=0), watch.input)


class _BlockWatch:
    """Which block a saved tensor belongs to (forward hooks around each block), and the
    largest block input; `checkpointed` puts each block's forward under
    torch.utils.checkpoint."""

    def __init__(self, blocks: list, checkpointed: bool) -> None:
        from torch.utils.checkpoint import checkpoint

        self.current: int | None = None
        self.saved = [0] * len(blocks)
        self.input = 0
        for i, block in enumerate(blocks):
            if checkpointed:
                plain = block.forward
                block.forward = lambda *a, _f=plain, **k: checkpoint(
                    _f, *a, use_reentrant=False, **k)
            block.register_forward_pre_hook(lambda m, args, i=i: self.enter(i, args))
            block.register_forward_hook(lambda m, args, out: self.leave())

    def enter(self, i: int, args: tuple) -> None:
        import torch

        self.current = i
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is not None:
            self.input = max(self.input, first.untyped_storage().nbytes())

    def leave(self) -> None:
        self.current = None

    def add(self, nbytes: int) -> None:
        if self.current is not None:
            self.saved[self.current] += nbytes


def _copy(model, spec: str):
    """The meta model copied for one trace; a module that cannot be copied, in one line."""
    import copy

    try:
        return copy.deepcopy(model)
    except Exception as exc:  # noqa: BLE001 - the user's module: said in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"`--model {spec}`: `phalanx plan` traces a copy of the model built "
                        f"on the meta device, and copying it raised {type(exc).__name__}: "
                        f"{first} (give the module a working __deepcopy__, or keep tensors "
                        f"that are not parameters or buffers off its attributes).") from None


def _forward_error(spec: str, exc: Exception) -> UserError:
    """What the user's forward raised when traced, in one line."""
    text = str(exc).strip().rstrip(".")
    return UserError(f"`--model {spec}`: its forward on the meta device raised "
                     f"{type(exc).__name__}{': ' + text.splitlines()[0] if text else ''}"
                     f" (traced on fake tensors: shapes, no data). `phalanx plan` needs a "
                     f"forward that runs without real data (no .item(), no data-dependent "
                     f"shapes).")
