"""The lint's walk skips what never holds a node, and `dotted` reads any chain."""

from __future__ import annotations

import ast
import sys

import pytest

from phalanx.lint.syntax import dotted, walk


def test_walk_finds_every_node_but_the_expression_contexts() -> None:
    tree = ast.parse("import a as b\nfrom c import d\n@dec\ndef f(x, *, y=1):\n"
                     "    global g\n    return [i.z for i in x if i] + x[0].w(y='s')\n")
    ours = walk(tree)
    theirs = [n for n in ast.walk(tree) if not isinstance(n, ast.expr_context)]
    assert ours == theirs


@pytest.mark.skipif(sys.version_info < (3, 12), reason="`type X = ...` is Python 3.12+")
def test_a_type_alias_name_is_walked() -> None:
    tree = ast.parse("type DDP = object\n")
    assert any(isinstance(n, ast.Name) and n.id == "DDP" for n in walk(tree))


def test_dotted_reads_a_chain_deeper_than_the_recursion_limit() -> None:
    node: ast.expr = ast.Name(id="x", ctx=ast.Load())
    for i in range(2 * sys.getrecursionlimit()):
        node = ast.Attribute(value=node, attr="a", ctx=ast.Load())
        if i % 2:
            node = ast.Call(func=node, args=[], keywords=[])
    assert dotted(node) == "x" + ".a" * (2 * sys.getrecursionlimit())
    assert dotted(ast.parse("f(a)[0].b.c()").body[0].value) == "b.c"  # type: ignore[attr-defined]
