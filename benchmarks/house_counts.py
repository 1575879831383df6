"""Issue 42's counts, by an AST scan of a source tree (no import, no run):

    python benchmarks/house_counts.py [SRC]      # default: src/phalanx of this checkout

- `choose()` call sites (the function that decides a strategy);
- role predicates: calls of the functions that ask "which process am I?";
- readers of `PHALANX_*` variables: `os.environ[...]`, `.get`, `os.getenv`, `in os.environ`
  with a `protocol.NAME` or a "PHALANX_…" literal;
- reads of RANK / LOCAL_RANK / WORLD_SIZE / SLURM_PROCID outside cluster/;
- whole-file replacements: functions that call `os.replace` / `os.rename`.
The counts of a run (parses, `choose()` evaluations per process) are in
tests/e2e/test_one_job.py; this counts the code."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROLE = {"under_launcher", "phalanx_worker", "replica_group", "in_replica_group",
        "restart_attempt", "owns_run_dir", "one_machine_worker", "speaks_for_the_job",
        "handed_job"}
LAUNCH = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _key(node: ast.AST, protocol_names: set[str]) -> str | None:
    """The variable a read names: a literal, or protocol.NAME."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and node.attr in protocol_names:
        return "PHALANX_" + node.attr
    return None


def _env_reads(tree: ast.AST, protocol_names: set[str]):
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and _environ(node.value) \
                and isinstance(node.ctx, ast.Load):
            key = _key(node.slice, protocol_names)
        elif isinstance(node, ast.Call) and node.args and (
                (_name(node.func) == "get" and isinstance(node.func, ast.Attribute)
                 and _environ(node.func.value)) or _name(node.func) == "getenv"):
            key = _key(node.args[0], protocol_names)
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn))
                                                   for o in node.ops) \
                and any(_environ(c) for c in node.comparators):
            key = _key(node.left, protocol_names)
        if key:
            yield key


def count(src: Path) -> dict[str, int]:
    protocol = ast.parse((src / "cluster" / "protocol.py").read_text())
    names = {t.id for n in protocol.body if isinstance(n, ast.Assign) for t in n.targets
             if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)
             and str(n.value.value).startswith("PHALANX_")}
    found = dict.fromkeys(["choose() call sites", "role-predicate calls",
                           "PHALANX_* reads", "launch-variable reads outside cluster/",
                           "functions that replace a file (os.replace/os.rename)"], 0)
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inside_cluster = path.relative_to(src).parts[0] == "cluster"
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "choose":
                found["choose() call sites"] += 1
            if isinstance(node, ast.Call) and _name(node.func) in ROLE:
                found["role-predicate calls"] += 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(c, ast.Call) and _name(c.func) in ("replace", "rename")
                    and isinstance(c.func, ast.Attribute) and _name(c.func.value) == "os"
                    for c in ast.walk(node)):
                found["functions that replace a file (os.replace/os.rename)"] += 1
        for key in _env_reads(tree, names):
            if key.startswith("PHALANX_"):
                found["PHALANX_* reads"] += 1
            if key in LAUNCH and not inside_cluster:
                found["launch-variable reads outside cluster/"] += 1
    return found


def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
               / "src" / "phalanx")
    for label, n in count(src).items():
        print(f"{n:5d}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
