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
    """`torch.nn.DataParallel` for the expression naming a callable, '' otherwise (an
    attribute's or a call's found once and kept on it: the lint asks millions of times)."""
    kind = type(node)
    if kind is ast.Name:
        return node.id  # type: ignore[attr-defined]
    if kind is not ast.Attribute and kind is not ast.Call:
        return node.id if isinstance(node, ast.Name) else _dotted(node)
    found = getattr(node, "_phalanx_dotted", None)
    if found is None:
        found = node._phalanx_dotted = _dotted(node)  # type: ignore[attr-defined]
    return found


def _dotted(node: ast.AST) -> str:
    """`dotted` without recursion (a chain of thousands of attributes and calls is legal)."""
    attrs: list[str] = []
    while isinstance(node, (ast.Attribute, ast.Call)):
        if isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        else:
            node = node.func
    base = [node.id] if isinstance(node, ast.Name) else []
    return ".".join(base + attrs[::-1])


def last(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


SCALARS = frozenset({"ctx", "id", "attr", "name", "asname", "module", "level", "arg", "kind",
                     "type_comment", "conversion", "is_async", "simple"})  # never a node
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}  # node type → its fields that may hold nodes


def child_fields(kind: type) -> tuple[str, ...]:
    """The fields of node type `kind` that may hold nodes, in `_fields` order: not a name,
    a number or the expression context (`Load`, `Store`, `Del`: one shared instance each,
    read as `node.ctx`), nor a constant's value or `global`'s names."""
    found = _CHILD_FIELDS.get(kind)
    if found is None:
        found = _CHILD_FIELDS[kind] = tuple(
            f for f in getattr(kind, "_fields", ()) if _may_hold_nodes(kind, f))
    return found


def _may_hold_nodes(kind: type, field: str) -> bool:
    if field == "name":  # a string, except 3.12's `type X = ...` (TypeAlias: a Name node)
        return kind is getattr(ast, "TypeAlias", None)
    return field not in SCALARS and not (kind is ast.Constant and field == "value") \
        and not (kind in (ast.Global, ast.Nonlocal) and field == "names")


def children(node: ast.AST) -> list[ast.AST]:
    """`node`'s direct children, in `ast.iter_child_nodes`' order, as a list (without the
    expression context, as `walk`)."""
    found: list[ast.AST] = []
    for name in child_fields(type(node)):
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            found.append(value)
        elif isinstance(value, list):
            found += [item for item in value if isinstance(item, ast.AST)]
    return found


def walk(node: ast.AST, parents: dict[ast.AST, ast.AST] | None = None) -> list[ast.AST]:
    """Every node under `node`, itself first, in `ast.walk`'s order (breadth first), as a
    list: `ast.walk` without its two generators per node (the lint's hottest loop), and
    without the expression contexts (`Load`, `Store`, `Del`: a third of a tree's nodes,
    one shared instance each, so no parent of their own; read them as `node.ctx`);
    `parents`, when given, gets each child's parent."""
    found = [node]
    AST = ast.AST
    fields = _CHILD_FIELDS
    for parent in found:  # (grows as it goes: breadth first)
        kind = type(parent)
        for name in fields[kind] if kind in fields else child_fields(kind):
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
