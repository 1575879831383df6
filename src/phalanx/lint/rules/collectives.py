"""Collectives that only some ranks reach: the others wait forever (a deadlock).

Also the collectives that do not look like one: the forward of a DDP model (it
broadcasts buffers) or of an FSDP model (it all-gathers parameters), an FSDP model's
`state_dict()` and `clip_grad_norm_`, `DTensor.full_tensor()`, DCP's save/load and
state-dict helpers, ZeRO's `consolidate_state_dict`, and Phalanx's own `Run` methods
that run one (RUN_COLLECTIVES) — directly, or through helper functions of this file or
of the other files linted with it (`Context.project`). A call reaches the helper it
names: `f()` this file's `f` (a local `gather` is no `dist.gather`), `self.f()` its
class's `C.f`, `mod.f()` the module imported as `mod` — `torch.save` is torch's. A
collective after an early `if rank != 0: return` is reachable only on some ranks too. A
helper whose collectives run only under tests of its parameters runs none at a call whose
constant arguments close them (lint.gates); a name is a DDP/FSDP model only at the uses
its wrapping assignment reaches (lint.wrapping)."""

from __future__ import annotations

import ast

from phalanx.lint.callees import DCP_CALLS, dcp_call, opens_for_all, own_group
from phalanx.lint.engine import Context, Rule, dotted, last, subtree
from phalanx.lint.gates import Gate, gate_of
from phalanx.lint.joining import joins_before_exit, other_branch_joins, paired
from phalanx.lint.libraries import (
    ACCELERATOR_COLLECTIVES,
    FABRIC_COLLECTIVES,
    library_call,
    library_receivers,
)
from phalanx.lint.own_runs import (
    COLLECTIVES,
    WRAPPERS,
    handed_kind,
    helper_key,
    here,
    hidden,
    is_dist_call,
    own_run,
    wrapped,
)
from phalanx.lint.proof import prove
from phalanx.lint.runapi import RUN_COLLECTIVES, run_call, run_receivers


def qualified(ctx: Context, func: ast.AST) -> str:
    """`f` for a function, `Class.f` for a method (helpers are known by this name)."""
    owner = ctx.parents.get(func)
    name = getattr(func, "name", "")
    return f"{owner.name}.{name}" if isinstance(owner, ast.ClassDef) else name


def collective_functions(ctx: Context) -> dict[str, str]:
    """Functions that (transitively) run a collective → the collective: this file's
    (`f`, `Class.method`), and the other linted files' (`ctx.project`) this file sees."""
    definite, forward = collective_kinds(ctx)
    return {**forward, **definite}


def collective_kinds(ctx: Context) -> tuple[dict[str, str], dict[str, str]]:
    """(functions that run a definite collective, functions whose only one is a DDP
    forward — a collective when the model has buffers or rebuilds its buckets), each →
    what it runs. A function that runs both is definite."""
    definite, forward, _ = kinds_and_gates(ctx)
    return definite, forward


def kinds_and_gates(ctx: Context) -> tuple[dict[str, str], dict[str, str], dict[str, Gate]]:
    """`collective_kinds`, and the gates of the helpers (this file's, and the other
    files' it sees: `ctx.gates`) whose collectives depend on their parameters (lint.gates).
    Judged twice: a call whose constants close its helper's gate runs no collective.
    Computed once per file and per view of the other files (several rules ask)."""
    key = (tuple(sorted(ctx.project.items())), tuple(sorted(ctx.forward_only)),
           tuple(sorted((k, id(v)) for k, v in ctx.gates.items())))
    memo = ctx.memo.setdefault("kinds_and_gates", {})
    if key not in memo:
        memo[key] = _kinds_and_gates(ctx)
    return memo[key]


def _kinds_and_gates(ctx: Context) -> tuple[dict[str, str], dict[str, str], dict[str, Gate]]:
    definite, forward = _kinds(ctx, ctx.gates)
    own = collective_gates(ctx, {**forward, **definite}, ctx.gates)
    if not own:
        return definite, forward, ctx.gates
    gates = {**ctx.gates, **own}
    definite, forward = _kinds(ctx, gates)
    return definite, forward, gates


def collective_gates(ctx: Context, helpers: dict[str, str], gates: dict[str, Gate]
                     ) -> dict[str, Gate]:
    """This file's functions among `helpers` whose collectives all run under tests of
    their parameters, each → its gate."""
    found: dict[str, Gate] = {}
    seen: set[str] = set()
    for func in (n for n in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)):
        name = qualified(ctx, func)
        if name in seen:  # defined twice: which one a call reaches is unknown
            found.pop(name, None)
            continue
        seen.add(name)
        if name not in helpers:
            continue
        running = [c for c in subtree(func) if isinstance(c, ast.Call) and _runs(
            ctx, c, helpers, inside=name, gates=gates) is not None]
        gate = gate_of(ctx, func, running)
        if gate is not None:
            found[name] = gate
    return found


def _kinds(ctx: Context, gates: dict[str, Gate]) -> tuple[dict[str, str], dict[str, str]]:
    calls = ctx.memo.get("function_calls")
    if calls is None:
        calls = ctx.memo["function_calls"] = {
            qualified(ctx, n): [c for c in subtree(n) if isinstance(c, ast.Call)]
            for n in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)}
    models, runs = wrapped(ctx), run_receivers(ctx)
    outside = {k: v for k, v in ctx.project.items() if k not in calls}
    definite = {k: v for k, v in outside.items() if k not in ctx.forward_only}
    forward = {k: v for k, v in outside.items() if k in ctx.forward_only}
    own = {name: [(call, own_run(ctx, call), helper_key(ctx, call))
                  for call in inside] for name, inside in calls.items()}  # (once, not per round)
    changed = True
    while changed:  # each function changes at most twice: found, then found definite
        changed = False
        for name, inside in own.items():
            if name in definite:
                continue
            helpers = {**forward, **definite}  # (its own entry is never its calls' helper)
            for call, what, key in inside:
                what = what or _helper_runs(call, key, helpers, name, gates)
                if what is None:
                    continue
                if not _forward_only(ctx, call, models, runs, forward, definite):
                    definite[name], changed = what, True
                    forward.pop(name, None)
                    break
                if name not in forward:
                    forward[name], changed = what, True
    return definite, forward


def _forward_only(ctx: Context, call: ast.Call, models: dict[str, str], runs: set[str],
                  forward: dict[str, str], definite: dict[str, str]) -> bool:
    """The collective `call` runs (as `_runs` finds it) is a DDP model's forward, or a
    helper's whose only collective is one."""
    if last(dotted(call)) in COLLECTIVES and is_dist_call(ctx, call):
        return False
    models = here(ctx, call, models)
    if models.get(dotted(call)) == "DDP" or handed_kind(ctx, call, models) == "DDP":
        return True
    if hidden(ctx, call, models) or run_call(call, runs) or \
            library_call(call, library_receivers(ctx)):
        return False
    key = helper_key(ctx, call)
    return key in forward and key not in definite


def _runs(ctx: Context, call: ast.Call, helpers: dict[str, str], inside: str | None = None,
          gates: dict[str, Gate] | None = None) -> str | None:
    """The collective `call` runs: a named one, a hidden one, Phalanx's `Run`'s, or a known
    helper's (not the function `inside` calling itself, nor one whose gate the call's
    constant arguments close)."""
    return own_run(ctx, call) or _helper_runs(call, helper_key(ctx, call), helpers, inside,
                                               gates)


def _helper_runs(call: ast.Call, key: str | None, helpers: dict[str, str], inside: str | None,
                 gates: dict[str, Gate] | None) -> str | None:
    """The collective of the known helper `key` that `call` reaches (not the function
    `inside` calling itself, nor a helper whose gate the call's constant arguments close)."""
    if key not in helpers or key == inside:
        return None
    if gates and key in gates and gates[key].closed(call):
        return None
    return helpers[key] if inside is None else f"{helpers[key]} (via `{last(dotted(call))}()`)"


def _rank_only(ctx: Context, forward: bool):
    """Calls running a collective under a rank guard: a definite one, or (`forward`) one
    whose only collective is a DDP model's forward."""
    libraries = (*ACCELERATOR_COLLECTIVES, *FABRIC_COLLECTIVES) \
        if library_receivers(ctx) else ()  # (common names: only with an Accelerator/Fabric)
    if not (ctx.mentions(*COLLECTIVES, *WRAPPERS, *DCP_CALLS, *RUN_COLLECTIVES, "full_tensor",
                         "consolidate_state_dict", *libraries) or ctx.project):
        return
    for call, what, only_forward in _running(ctx):
        if only_forward != forward:
            continue
        callee = last(dotted(call))
        if (callee in COLLECTIVES or dcp_call(ctx, call)) and own_group(call):
            continue  # only its group's members join: the guard may hold alike for them
        guards = ctx.rank_guards(call, callers=False)  # a guarded caller is reported itself
        guard = guards[0] if guards else None
        if guard is None or opens_for_all(ctx, guard.test, guard.holds) or other_branch_joins(ctx, call, callee) \
                or paired(ctx, call, guard, callee) or joins_before_exit(guard, callee):
            continue
        shown = what if "`" in what else f"`{what}`"
        yield call, f"({shown} {guard.describe()}: the other ranks never join it)", guards


def _rank_only_proof(ctx: Context) -> list[tuple[ast.Call, str, tuple[int | None, str]]]:
    """PX301's candidates, each with its proof: (the rank proven to skip it, or None and
    the term not proven; lint.proof)."""
    memo = ctx.memo.setdefault("rank_only_proof", {})
    if "found" not in memo:
        (definite, forwards, gates), models = kinds_and_gates(ctx), wrapped(ctx)
        helpers = {**forwards, **definite}

        def joins(call: ast.Call) -> bool:
            return _runs(ctx, call, helpers, gates=gates) is not None
        memo["found"] = [(call, message, prove(ctx, call, guards, COLLECTIVES, joins,
                                               here(ctx, call, models)))
                         for call, message, guards in _rank_only(ctx, forward=False)]
    return memo["found"]


def _running(ctx: Context) -> list[tuple[ast.Call, str, bool]]:
    """(call, what it runs, whether only a DDP forward): found once for both rules."""
    (definite, forwards, gates), models = kinds_and_gates(ctx), wrapped(ctx)
    runs, helpers = run_receivers(ctx), {**forwards, **definite}
    key = (tuple(sorted(helpers.items())), tuple(sorted(forwards)),
           tuple(sorted((k, id(v)) for k, v in gates.items())))
    memo = ctx.memo.setdefault("running", {})
    if key not in memo:
        memo[key] = [(call, what, _forward_only(ctx, call, models, runs, forwards, definite))
                     for call in ctx.calls if (what := _runs(
                         ctx, call, helpers, gates=gates)) is not None]
    return memo[key]


def _rank_only_collective(ctx: Context):
    for call, message, (rank, _) in _rank_only_proof(ctx):
        if rank is not None:
            yield call, message.replace("the other ranks never join it",
                                        f"rank {rank} never reaches it and runs no "
                                        f"collective in its place")


def _rank_only_suspected(ctx: Context):
    for call, message, (rank, why) in _rank_only_proof(ctx):
        if rank is None:
            yield call, f"{message[:-1]}; not proven: {why})"


def _rank_only_forward(ctx: Context):
    for call, message, _ in _rank_only(ctx, forward=True):
        yield call, message


RULES = [
    Rule("PX301", "error", "A collective proven reachable only on some ranks: a deadlock.",
         "Run the collective on every rank; keep only the printing/saving under the rank "
         "condition.",
         "def log_metrics(loss):\n    dist.all_reduce(loss)\n    print(loss.item())\n\n"
         "rank = dist.get_rank()\nif rank == 0:\n    log_metrics(loss)  # <-",
         "def log_metrics(loss):\n    dist.all_reduce(loss)\n    return loss.item()\n\n"
         "rank = dist.get_rank()\nvalue = log_metrics(loss)\nif rank == 0:\n    print(value)",
         _rank_only_collective),
    Rule("PX303", "warning", "A collective that may be reachable only on some ranks: the "
         "analysis could not prove it (PX301 is the proven case).",
         "Check that every rank reaches the collective; if the condition is the same on "
         "every rank, or the call runs no collective here, nothing is wrong.",
         "if args.rank == 0:  # a parameter: not known to be the global rank\n"
         "    dist.barrier()  # <-",
         "dist.barrier()\nif args.rank == 0:\n    print('saved')", _rank_only_suspected),
    Rule("PX302", "warning", "A DDP model's forward reachable only on some ranks: a deadlock "
         "when the model has buffers (DDP broadcasts them at every forward) or when it "
         "rebuilds its buckets.",
         "Evaluate on the unwrapped module, `model.module(x)`, on the ranks that need it (it "
         "runs no collective), or run the forward on every rank.",
         "model = DDP(net)\nif rank == 0:\n    with torch.no_grad():\n"
         "        out = model(x)  # <-",
         "model = DDP(net)\nif rank == 0:\n    with torch.no_grad():\n"
         "        out = model.module(x)", _rank_only_forward),
]
