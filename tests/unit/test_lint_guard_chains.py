"""Guards and rank names found through long chains: a caller guard through more callers
than the recursion limit allows frames, a cycle of unguarded calls with none, and rank
names that alternate assignments and properties."""

from __future__ import annotations

import ast
import sys

from phalanx.lint.engine import Context


def _save_call(ctx: Context) -> ast.Call:
    return next(c for c in ctx.calls if ast.unparse(c.func) == "torch.save")


def test_a_caller_guard_is_found_through_a_chain_longer_than_the_recursion_limit() -> None:
    n = 2 * sys.getrecursionlimit()
    lines = ["import torch", "import torch.distributed as dist",
             "def f0():", "    torch.save({}, 'x.pt')"]
    lines += [f"def f{i}():\n    f{i - 1}()" for i in range(1, n)]
    lines += ["if dist.get_rank() == 0:", f"    f{n - 1}()"]
    ctx = Context("chain.py", "\n".join(lines) + "\n")
    guard = ctx.rank_guard(_save_call(ctx))
    assert guard is not None and guard.kind == "caller" and guard.via == "f0"
    assert ast.unparse(guard.test) == "dist.get_rank() == 0"


def test_one_unguarded_call_anywhere_on_the_chain_means_no_guard() -> None:
    source = ("import torch\nimport torch.distributed as dist\n"
              "def f0():\n    torch.save({}, 'x.pt')\n"
              "def f1():\n    f0()\n"
              "def f2():\n    f1()\n"
              "if dist.get_rank() == 0:\n    f2()\n"
              "f1()\n")  # (f1 also called on every rank)
    ctx = Context("chain.py", source)
    assert ctx.rank_guard(_save_call(ctx)) is None


def test_a_cycle_of_unguarded_calls_has_no_guard_and_a_guarded_entry_does() -> None:
    cycle = ("import torch\nimport torch.distributed as dist\n"
             "def f(n):\n    torch.save({}, 'x.pt')\n    g(n - 1)\n"
             "def g(n):\n    f(n)\n")
    ctx = Context("cycle.py", cycle)
    assert ctx.rank_guard(_save_call(ctx)) is None
    entry = cycle.replace("    f(n)\n", "    if dist.get_rank() == 0:\n        f(n)\n")
    entry += "if dist.get_rank() == 0:\n    g(3)\n"
    ctx = Context("cycle.py", entry)
    guard = ctx.rank_guard(_save_call(ctx))
    assert guard is not None and guard.via == "f"


def test_rank_names_alternating_assignments_and_properties() -> None:
    ctx = Context("props.py", (
        "import os\n"
        "class T:\n"
        "    def __init__(self):\n"
        "        self.gid = int(os.environ['LOCAL_RANK'])\n"
        "        self.saver = self.lead\n"
        "    @property\n"
        "    def lead(self):\n        return self.gid == 0\n"
        "    @property\n"
        "    def is_saver(self):\n        return self.saver\n"))
    assert {"self.gid", "self.lead", "self.saver", "self.is_saver"} <= ctx.rank_names
