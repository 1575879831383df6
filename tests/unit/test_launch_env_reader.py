"""One reader of the launch environment (issue 42): outside `phalanx/cluster/` no module
reads RANK, LOCAL_RANK, WORLD_SIZE or SLURM's rank variables from `os.environ` itself —
it asks `cluster.env` (`detect_launch_env`, or `global_rank`/`local_rank`/`launched_world`
/`has_ranks` to decide who speaks before `phalanx.init`). An AST scan, so a read written
any way (subscript, `.get`, `os.getenv`, `in os.environ`) is found."""

from __future__ import annotations

import ast
from pathlib import Path

from phalanx.cluster.env import global_rank, has_ranks, launched_world, local_rank

SRC = Path(__file__).resolve().parents[2] / "src" / "phalanx"
LAUNCH_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                    "SLURM_STEP_NUM_TASKS", "SLURM_NODEID"}
ENVIRON = {"os.environ", "environ"}


def launch_reads(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ENVIRON:
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in {
                "os.environ.get", "environ.get", "os.getenv", "getenv"} and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                ast.unparse(c) in ENVIRON for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and key.value in LAUNCH_VARIABLES:
            found.append((node.lineno, key.value))
    return found


def test_no_module_outside_cluster_reads_the_launch_variables():
    outside = [f"{path.relative_to(SRC)}:{line}: {name}"
               for path in sorted(SRC.rglob("*.py"))
               if "cluster" not in path.relative_to(SRC).parts[:1]
               and "lint" not in path.relative_to(SRC).parts[:1]  # rules name them in text
               for line, name in launch_reads(ast.parse(path.read_text()))]
    assert outside == [], outside


def test_the_scan_finds_every_way_of_reading():
    code = ('import os\nos.environ["RANK"]\nos.environ.get("LOCAL_RANK")\n'
            'os.getenv("WORLD_SIZE")\n"SLURM_PROCID" in os.environ\nos.environ["HOME"]\n')
    assert [n for _, n in launch_reads(ast.parse(code))] == [
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID"]


def test_the_lenient_readers():
    assert global_rank({}) == 0 and local_rank({}) == 0 and launched_world({}) == 1
    assert global_rank({"SLURM_PROCID": "3"}) == 3
    assert global_rank({"RANK": "2", "SLURM_PROCID": "3"}) == 2
    assert global_rank({"RANK": "x"}) is None and launched_world({"WORLD_SIZE": "y"}) is None
    assert local_rank({"SLURM_LOCALID": "1"}) == 1
    assert has_ranks({"RANK": "0", "WORLD_SIZE": "2"}) and not has_ranks({"RANK": "0"})
