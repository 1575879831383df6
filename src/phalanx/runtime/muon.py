"""Muon for the hidden matrices, AdamW for everything else — one optimizer that every
strategy can hold.

Muon (Keller Jordan, 2024; the GPT-2 speedrun's optimizer; `torch.optim.Muon` since torch
2.9) replaces each hidden weight matrix's momentum update by its nearest semi-orthogonal
matrix, computed by a few Newton–Schulz iterations. That needs the WHOLE matrix, which is
what makes it interesting under sharding:

- ddp, single: every rank holds whole parameters and whole (all-reduced) gradients.
- zero: `ZeroRedundancyOptimizer` partitions *parameters* (whole tensors) across ranks, so
  each rank runs Muon on whole matrices it owns; this class is what it re-creates.
- fsdp: each rank holds a row shard (a DTensor) of every matrix. The momentum is kept
  sharded (it is elementwise); the update is all-gathered (`full_tensor()`),
  orthogonalised identically on every rank, and each rank keeps its own rows (a local
  slice: `redistribute` from Replicate to the parameter's Shard placement moves no data).
  Cost: one all-gather of each hidden matrix per optimizer step — as much as one more
  FSDP forward pass over those matrices — plus Newton–Schulz computed on every rank.

torch's own `Muon` takes plain 2-D tensors only and no other parameters, so it can be
neither partitioned with AdamW groups by ZeRO nor fed DTensor shards; the Newton–Schulz
iteration below is the same quintic one (the same coefficients). AdamW groups use
torch's functional `adamw`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn as nn
from torch.optim.adamw import adamw as adamw_step

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(g: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The Newton–Schulz quintic iteration toward U·Vᵀ of g = U·S·Vᵀ (as torch.optim.Muon;
    torch computes in bf16 — fp32 here by default: exact to compare across strategies,
    and small matrices on a CPU gain nothing from bf16)."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if tall else x).to(g.dtype)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: all-gather); a plain tensor as it is."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value` (whole, identical on every rank) laid out as `param`: a DTensor's own
    shard (a local slice), or `value` itself."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is None:
        return value
    from torch.distributed.tensor import DTensor, Replicate

    whole = DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return whole.redistribute(mesh, param.placements)  # type: ignore[attr-defined]


class MuonAdamW(torch.optim.Optimizer):
    """Param groups with `use_muon=True` step with Muon (lr × `lr_scale`), the others with
    AdamW. Build it with `muon_adamw(model, ...)`, which chooses the groups.
    `phalanx_waiting`: the context its all-gathers (sharded parameters) run in — `run.setup`
    sets it so the straggler check counts them as waits (runtime.pace)."""

    phalanx_waiting: Callable[[], AbstractContextManager] = nullcontext

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 use_muon: bool = False, lr_scale: float = 1.0) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, betas=betas, eps=eps,
                        momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                        use_muon=use_muon, lr_scale=lr_scale)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["use_muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups hold 2-D weight matrices only")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon(group)
            else:
                self._adamw(group)
        return loss

    def _muon(self, group: dict) -> None:
        lr = group["lr"] * group["lr_scale"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - group["momentum"])
            update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
            with self.phalanx_waiting():
                whole = _whole(update)
            ortho = orthogonalize(whole, group["ns_steps"])
            rows, cols = ortho.shape
            ortho *= math.sqrt(max(1.0, rows / cols))  # torch.optim.Muon's "original" scale
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(_like(ortho, p), alpha=-lr)

    def _adamw(self, group: dict) -> None:
        params, grads, avgs, sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            avgs.append(state["exp_avg"])
            sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if params:
            beta1, beta2 = group["betas"]
            adamw_step(params, grads, avgs, sqs, [], steps, foreach=False, amsgrad=False,
                       beta1=beta1, beta2=beta2, lr=group["lr"],
                       weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


def hidden_matrices(model: nn.Module, vocab_size: int | None = None) -> set[int]:
    """ids of the parameters Muon steps: the weights of `nn.Linear` layers, except the
    output head — the last Linear with `vocab_size` outputs (a hidden layer that happens
    to be as wide as the vocabulary stays Muon's) — and weights shared with an embedding.
    Embeddings, norms, biases and the head stay with AdamW (as in the speedrun: Muon is
    for hidden layers)."""
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.dim() == 2]
    head = next((m for m in reversed(linears)
                 if vocab_size is not None and m.out_features == vocab_size), None)
    return {id(m.weight) for m in linears if m is not head and id(m.weight) not in embedded}


def muon_adamw(model: nn.Module, params: Iterable[nn.Parameter], *, lr: float,
               muon_lr: float, weight_decay: float, betas: tuple[float, float],
               vocab_size: int | None = None) -> MuonAdamW:
    """Muon (at `muon_lr`, no weight decay) on `model`'s hidden matrices; AdamW (at `lr`)
    with weight decay on the other matrices and none on 1-D tensors. `params`: the
    parameters to optimise (the wrapped model's; `model` is read at call time, so under
    FSDP it already holds the sharded ones)."""
    params = [p for p in params if p.requires_grad]
    hidden = hidden_matrices(model, vocab_size)
    groups = [
        {"params": [p for p in params if id(p) in hidden], "use_muon": True,
         "weight_decay": 0.0, "lr_scale": muon_lr / lr},
        {"params": [p for p in params if id(p) not in hidden and p.dim() >= 2],
         "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) not in hidden and p.dim() < 2],
         "weight_decay": 0.0},
    ]
    return MuonAdamW([g for g in groups if g["params"]], lr=lr, betas=betas)
