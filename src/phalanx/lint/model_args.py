"""Helpers that run a model they are given: `def evaluate(model, batch): return model(batch)`
runs a collective when it is handed a DDP or FSDP model (its forward broadcasts buffers or
all-gathers parameters), whatever the parameter is called and whichever file defines it.
`takers(ctx)` finds a file's module-level functions that call one of their parameters
(`p(...)`, `p.forward(...)`, `p.state_dict()`); `handed(...)` says which wrapped model a
call of one is given, by position or keyword."""

from __future__ import annotations

import ast

from phalanx.lint.syntax import dotted, subtree, walk

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
RUNS_MODEL = {"forward": "forward", "state_dict": "state_dict"}  # p.<method>() → what


def takers(tree: ast.Module) -> dict[str, tuple[tuple[int, str, str], ...]]:
    """Module-level function → ((position, parameter, what it runs: forward/state_dict), …)
    for each parameter it calls or asks for its state dict (not one it assigns first)."""
    found: dict[str, tuple[tuple[int, str, str], ...]] = {}
    for func in tree.body:
        if not isinstance(func, FUNCTIONS):
            continue
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        if not params:
            continue  # (nothing handed to it)
        assigned = {t.id for n in subtree(func) if isinstance(n, (ast.Assign, ast.AugAssign,
                                                                    ast.AnnAssign))
                    for t in _targets(n) if isinstance(t, ast.Name)}
        uses: dict[str, str] = {}
        for call in (n for n in subtree(func) if isinstance(n, ast.Call)):
            name, what = _called_parameter(call)
            if name in params and name not in assigned:
                uses.setdefault(name, what)
        if uses:
            found[func.name] = tuple((params.index(p), p, w) for p, w in uses.items())
    return found


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return [n for t in node.targets for n in walk(t)]
    return [node.target]  # type: ignore[attr-defined]


def _called_parameter(call: ast.Call) -> tuple[str, str]:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id, "forward"
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.attr in RUNS_MODEL:
        return func.value.id, RUNS_MODEL[func.attr]
    return "", ""


def handed(call: ast.Call, params: tuple[tuple[int, str, str], ...],
           models: dict[str, str]) -> tuple[str, str, str] | None:
    """(the model's name, its wrapper: DDP/FSDP, what the helper runs) for the first
    wrapped model of `models` the call hands to one of `params`; None if none."""
    for position, name, what in params:
        arg = next((k.value for k in call.keywords if k.arg == name), None)
        if arg is None and position < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[:position + 1]):
            arg = call.args[position]
        model = dotted(arg) if arg is not None else ""
        if model in models and (what == "forward" or models[model] == "FSDP"):
            return model, models[model], what
    return None


def describe(model: str, kind: str, what: str, helper: str) -> str:
    """What the helper runs, said as `hidden` says a model's forward."""
    if what == "state_dict":
        return f"`{model}.state_dict()` of an FSDP model (a collective) in `{helper}()`"
    return (f"the forward of the {kind} model `{model}` in `{helper}()` ("
            + ("broadcasts buffers" if kind == "DDP" else "all-gathers parameters") + ")")
