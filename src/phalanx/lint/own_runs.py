"""What one call runs by itself, no helper of the linted files counted: a named collective
of torch.distributed, a collective that does not look like one (a DDP/FSDP model's
forward, an FSDP model's `state_dict()`, `DTensor.full_tensor()`, DCP's helpers, ZeRO's
`consolidate_state_dict`), Phalanx's `Run`'s, an Accelerator's or a Fabric's, or a
wrapped model handed to a helper that runs it — and which helper a call reaches
(`helper_key`). Each answer depends on the file alone and is kept per call
(lint.rules.collectives asks for every call, again and again)."""

from __future__ import annotations

import ast

from phalanx.lint.callees import DCP_CALLS, dcp_call
from phalanx.lint.engine import Context, dotted, keyword, last
from phalanx.lint.libraries import library_call, library_receivers
from phalanx.lint.model_args import describe, handed, takers
from phalanx.lint.runapi import RUN_COLLECTIVES, run_call, run_receivers
from phalanx.lint.wrapping import bound_by, holds_wrapper

COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
               "broadcast_object_list", "barrier", "gather", "gather_object", "scatter",
               "scatter_object_list", "all_to_all", "all_to_all_single", "monitored_barrier"}

WRAPPERS = {"DistributedDataParallel": "DDP", "DDP": "DDP", "FullyShardedDataParallel": "FSDP",
            "FSDP": "FSDP", "fully_shard": "FSDP"}


def wrapped(ctx: Context) -> dict[str, str]:
    """Names holding a DDP / FSDP model: `m = DDP(...)`, `m = FSDP(...)`, `fully_shard(m)`.
    A DDP built with `broadcast_buffers=False` has a forward without a collective. (Found
    once per file: the file alone decides; read it, do not change it.)"""
    memo = ctx.memo.setdefault("wrapped", {})
    if "found" not in memo:
        memo["found"] = _wrapped(ctx)
    return memo["found"]


def _wrapped(ctx: Context) -> dict[str, str]:
    found: dict[str, str] = {}
    for call in ctx.calls_named(*WRAPPERS):
        kind = WRAPPERS[last(dotted(call))]
        if kind == "DDP" and isinstance(buffers := keyword(call, "broadcast_buffers"),
                                        ast.Constant) and buffers.value is False:
            continue
        found[bound_by(ctx, call)] = kind
    found.pop("", None)
    return found


def hidden(ctx: Context, call: ast.Call, models: dict[str, str]) -> str | None:
    """The collective `call` runs without being named one, or None."""
    name, func = dotted(call), call.func
    if name in models:
        return (f"the forward of the {models[name]} model `{name}` ("
                + ("broadcasts buffers" if models[name] == "DDP" else "all-gathers parameters")
                + ")")
    if dcp_call(ctx, call):
        return f"`{name}()` (DCP: collectives across ranks)"
    if not isinstance(func, ast.Attribute):
        return None
    receiver, method = dotted(func.value), func.attr
    if method in ("state_dict", "clip_grad_norm_") and models.get(receiver) == "FSDP":
        return f"`{receiver}.{method}()` of an FSDP model (a collective)"
    if method == "full_tensor":
        return "`full_tensor()` (an all-gather)"
    if method == "consolidate_state_dict":
        return "`consolidate_state_dict()` (ZeRO gathers the optimizer state)"
    return None


def own_run(ctx: Context, call: ast.Call) -> str | None:
    """The collective `call` runs by itself, no helper of this file's counted: a named
    one, a hidden one, Phalanx's `Run`'s, a library's, or a wrapped model handed to a
    model-running helper. All but the last depend on this file alone: found once per call
    (the analyses ask for every call, again and again)."""
    memo = ctx.memo.setdefault("own_run", {})
    if call in memo:
        found = memo[call]
    else:
        found = memo[call] = _named_or_hidden(ctx, call)
    if found is None and (models := wrapped(ctx)):  # (the helpers seen change with the view)
        return handed_model(ctx, call, here(ctx, call, models))
    return found


def _named_or_hidden(ctx: Context, call: ast.Call) -> str | None:
    callee = last(dotted(call))
    if callee not in _may_run(ctx):
        return None
    if callee in COLLECTIVES and is_dist_call(ctx, call):
        return callee
    return hidden(ctx, call, here(ctx, call, wrapped(ctx))) or run_call(
        call, run_receivers(ctx)) or library_call(call, library_receivers(ctx))


def _may_run(ctx: Context) -> set[str]:
    """The last names (`x.NAME()`, `NAME()`) of the calls `_named_or_hidden` may find
    running a collective in this file: a named collective, DCP's, a method of an FSDP
    model or a DTensor that runs one, `Run`'s, an Accelerator's or a Fabric's, a wrapped
    model's own name. Any other call runs none by itself (most calls: asked first)."""
    memo = ctx.memo.setdefault("may_run", {})
    if "found" not in memo:
        memo["found"] = COLLECTIVES | DCP_CALLS | RUN_COLLECTIVES.keys() | {
            "save", "load", "state_dict", "clip_grad_norm_", "full_tensor",
            "consolidate_state_dict"} | {
            method for table in library_receivers(ctx).values() for method in table} | {
            last(name) for name in wrapped(ctx)}
    return memo["found"]


def here(ctx: Context, call: ast.Call, models: dict[str, str]) -> dict[str, str]:
    """`models` less the names `call` uses (`model(x)`, `model.state_dict()`) that no
    wrapping assignment reaches there (lint.wrapping): before `model = DDP(model)`."""
    func = call.func
    names = [func, func.value] if isinstance(func, ast.Attribute) else [func]
    gone = set()
    for node in names:
        kind = models.get(dotted(node))
        if kind is None or not isinstance(node, (ast.Name, ast.Attribute)) or (
                kind == "FSDP" and ctx.mentions("fully_shard")):  # wraps in place
            continue
        if not holds_wrapper(ctx, node, call, {k for k, v in WRAPPERS.items() if v == kind}):
            gone.add(dotted(node))
    return {k: v for k, v in models.items() if k not in gone} if gone else models


def handed_kind(ctx: Context, call: ast.Call, models: dict[str, str]) -> str | None:
    """The wrapper (DDP/FSDP) of the model `call` hands to a helper that runs it."""
    params = takers_of(ctx).get(helper_key(ctx, call) or "")
    found = handed(call, params, models) if params and models else None
    return found[1] if found else None


def handed_model(ctx: Context, call: ast.Call, models: dict[str, str]) -> str | None:
    """`the forward of the FSDP model `model` in `evaluate()` (…)` when `call` hands a
    wrapped model to a helper (this file's or an imported one) that runs it."""
    if not models:
        return None
    key = helper_key(ctx, call) or ""
    params = takers_of(ctx).get(key)
    found = handed(call, params, models) if params else None
    return describe(*found, key) if found else None


def takers_of(ctx: Context) -> dict[str, tuple]:
    """This file's model-running helpers (lint.model_args), and those it imports."""
    memo = ctx.memo.setdefault("takers", {})
    if memo.get("seen") is not ctx.takers:  # (the imported ones change with the view)
        own = memo.get("own")
        if own is None:
            own = memo["own"] = takers(ctx.tree)
        memo["all"], memo["seen"] = ({**ctx.takers, **own} if ctx.takers else own), ctx.takers
    return memo["all"]


def helper_key(ctx: Context, call: ast.Call) -> str | None:
    """The helper `call` reaches, by qualified name: `f()` → `f`; `self.f()`/`cls.f()` →
    the enclosing class's `C.f`; `C.f()` of a class of this file → `C.f`; `mod.f()` of an
    imported linted module → `mod.f` — never another object's `f`, nor torch's `save`.
    (Kept per call: the file alone decides, and the analyses ask again and again.)"""
    memo = ctx.memo.setdefault("helper_key", {})
    if call not in memo:
        memo[call] = _helper_key(ctx, call)
    return memo[call]


def _helper_key(ctx: Context, call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if not isinstance(func, ast.Attribute):
        return None
    receiver = dotted(func.value)
    if receiver in ("self", "cls"):
        owner = next((a for a in ctx.ancestors(call) if isinstance(a, ast.ClassDef)), None)
        return f"{owner.name}.{func.attr}" if owner is not None else None
    if isinstance(func.value, ast.Name) and receiver in ctx.defined:
        return f"{receiver}.{func.attr}"
    if receiver and receiver.split(".")[0] in ctx.imported:
        return f"{receiver}.{func.attr}"
    return None


def is_dist_call(ctx: Context, call: ast.Call) -> bool:
    """`dist.all_reduce(...)`, `torch.distributed.barrier()`, or a bare name imported from
    torch.distributed (or not imported at all: a snippet) — not `functools.reduce`, nor
    `some_list.reduce` of another library, nor a function of this file named `gather`."""
    name = dotted(call)
    if "." not in name:
        origin = ctx.imported.get(name)
        if origin is None:
            return name not in ctx.defined
        return origin.startswith("torch.distributed")
    return name.split(".")[-2] in ("dist", "distributed", "accelerator")
