"""Pure-syntax questions about `ast` nodes, shared by the engine and the analyses built on
it (guards, bindings, callers): what a callable is named, a call's keyword, whether an
expression reads a rank. Imports nothing from phalanx.lint."""

from __future__ import annotations

import ast

RANK_NAMES = {"rank", "local_rank", "global_rank", "is_main", "is_main_process", "is_master",
              "is_rank_zero", "is_global_zero", "master_process", "is_local_main_process",
              "is_last_process", "process_index", "local_process_index"}  # (Accelerate's)
RANK_CALLS = {"get_rank", "get_local_rank", "get_global_rank"}


def rank_call(name: str) -> bool:
    """A callable reading a rank: `get_rank`, `get_local_rank`, or any `get_..._rank` of a
    parallel group: Megatron's `mpu.get_data_parallel_rank()`,
    `parallel_state.get_pipeline_model_parallel_rank()` — not `torch.linalg.matrix_rank`."""
    name = last(name)
    return name in RANK_CALLS or (name.startswith("get_") and name.endswith("_rank"))


def dotted(node: ast.AST) -> str:
    """`torch.nn.DataParallel` for the expression naming a callable, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func)
    return ""


def last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def children(node: ast.AST) -> list[ast.AST]:
    """`node`'s direct children, in `ast.iter_child_nodes`' order, as a list."""
    found: list[ast.AST] = []
    for name in node._fields:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            found.append(value)
        elif isinstance(value, list):
            found += [item for item in value if isinstance(item, ast.AST)]
    return found


def walk(node: ast.AST, parents: dict[ast.AST, ast.AST] | None = None) -> list[ast.AST]:
    """Every node under `node`, itself first, in `ast.walk`'s order (breadth first), as a
    list: `ast.walk` without its two generators per node (the lint's hottest loop);
    `parents`, when given, gets each child's parent."""
    found = [node]
    AST = ast.AST
    for parent in found:  # (grows as it goes: breadth first)
        for name in parent._fields:
            value = getattr(parent, name, None)
            if isinstance(value, AST):
                found.append(value)
                if parents is not None:
                    parents[value] = parent
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, AST):
                        found.append(item)
                        if parents is not None:
                            parents[item] = parent
    return found


def subtree(node: ast.AST) -> list[ast.AST]:
    """Every node under `node`, itself first, in `ast.walk`'s order: walked once per node
    and kept on it (several rules and the call-graph rounds ask for a function's nodes)."""
    found = getattr(node, "_phalanx_subtree", None)
    if found is None:
        found = walk(node)
        node._phalanx_subtree = found  # type: ignore[attr-defined]
    return found


def rank_dependent(test: ast.AST) -> bool:
    """`test` reads a rank: a rank-named name or attribute, `get_rank()` (`rank_call`),
    `"RANK"`."""
    for node in walk(test):
        if isinstance(node, ast.Name) and node.id.lower() in RANK_NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr.lower() in RANK_NAMES:
            return True
        if isinstance(node, ast.Call) and rank_call(dotted(node)):
            return True
        if isinstance(node, ast.Constant) and node.value in ("RANK", "LOCAL_RANK"):
            return True
    return False


def whether_distributed(test: ast.AST) -> bool:
    """`int(os.environ.get("RANK", -1)) != -1`, `rank is None`: the same on every rank."""
    return any(isinstance(n, ast.Constant) and n.value is None or
               isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub)
               or isinstance(n, ast.Constant) and n.value == -1 and not isinstance(n.value, bool)
               for n in walk(test))
