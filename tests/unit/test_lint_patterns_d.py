"""`phalanx lint`'s model of the code against the false findings of the held-out precision
study: imports in parentheses over several lines (cross-file facts), `cuda:0` where each
process sees only its own GPU or on the single-process side of a branch (PX103), a batch
tensor only passed to the model (PX105), loaders read by one rank or holding all-gathered
data (PX201), MASTER_PORT defaults (PX701), the arms of one `if` and dead helpers (PX702),
and the deprecated AMP API through an import (PX603) — each silent case next to the true
one still found."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.lint.engine import Context, lint_source
from phalanx.lint.fix import decode, fix_file
from phalanx.lint.imports import import_statements
from phalanx.lint.project import build_project
from phalanx.lint.rules import ALL, BY_CODE
from phalanx.lint.rules.placement import single_process_branch

INIT = "import os, torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"


def codes(source: str, *wanted: str) -> list[tuple[str, int]]:
    rules = [BY_CODE[c] for c in wanted] if wanted else ALL
    return [(f.code, f.line) for f in lint_source("s.py", source, rules)]


def lint_tree(root: Path, files: dict[str, str]) -> set[tuple[str, str, int]]:
    """(file, code, line) of every finding when the files are linted together."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    paths = sorted(root.rglob("*.py"))
    project = build_project(paths)
    return {(p.relative_to(root).as_posix(), f.code, f.line) for p in paths
            for f in lint_source(str(p), p.read_text(), ALL, project)}


# 1. imports over several lines ------------------------------------------------------------

UTILS = "import torch, torch.distributed as dist\n\ndef setup():\n" \
        "    dist.init_process_group('nccl')\n\ndef clear_cache():\n    torch.cuda.empty_cache()\n"
TRAIN = ("import os, torch, torch.distributed as dist\n{imports}\n\ndef main():\n    setup()\n"
         "    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n    clear_cache()\n"
         "    dist.destroy_process_group()\nmain()\n")


@pytest.mark.parametrize("imports", [
    "from utils import (\n    clear_cache,  # (frees memory)\n    setup,\n)",
    "from utils import clear_cache, \\\n    setup",
    "from utils import clear_cache, setup",
])
def test_an_import_over_several_lines_connects_the_files(tmp_path, imports):
    found = lint_tree(tmp_path, {"utils.py": UTILS, "train.py": TRAIN.format(imports=imports)})
    assert {c for f, c, _ in found if f == "utils.py"} == set()
    # still found: the importer neither chooses the GPU nor destroys the group
    bare = TRAIN.format(imports=imports).replace(
        "    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n", "").replace(
        "    dist.destroy_process_group()\n", "")
    found = lint_tree(tmp_path, {"train.py": bare})
    assert {c for f, c, _ in found if f == "utils.py"} == {"PX104", "PX702"}


def test_import_statements_read_from_text_and_tree_agree():
    text = ("import os, torch.distributed as dist\nfrom utils import (\n    a,  # why (x)\n"
            "    b as c,\n)\nfrom .. mod import d, \\\n    e\nfrom pkg import *\n"
            "def f():\n    from torch.cuda import amp\n")
    from_text, from_tree = import_statements(text), import_statements(
        text, list(ast.walk(ast.parse(text))))
    assert from_text == from_tree
    assert from_text[1] == [("", "utils", ["a", "b"]), ("..", "mod", ["d", "e"]),
                            ("", "pkg", ["*"]), ("", "torch.cuda", ["amp"])]


# 2. PX103 -----------------------------------------------------------------------------------

WORKER = ("import os\ndef worker(rank, world_size):\n    os.environ['CUDA_VISIBLE_DEVICES'] = {v}\n"
          "    import torch, torch.distributed as dist\n"
          "    dist.init_process_group('nccl', rank=rank, world_size=world_size)\n"
          "    device = torch.device('cuda:0')\n")


def test_cuda_0_is_the_ranks_own_gpu_when_each_process_sees_only_its_own():
    assert codes(WORKER.format(v="str(rank)"), "PX103") == []
    assert codes(WORKER.format(v="os.environ['SLURM_LOCALID']"), "PX103") == []
    assert codes(WORKER.format(v="'0,1,2,3'"), "PX103") == [("PX103", 6)]  # the same for all


def test_a_per_rank_cuda_visible_devices_in_the_launcher_holds_for_the_program(tmp_path):
    train = "import torch, torch.distributed as dist\ndist.init_process_group('nccl')\n" \
            "x = torch.zeros(1, device='cuda:0')\n"
    launch = "import os\nimport train\ndef run(rank):\n" \
             "    os.environ['CUDA_VISIBLE_DEVICES'] = str(rank)\n"
    assert ("train.py", "PX103", 3) not in lint_tree(tmp_path, {"train.py": train,
                                                               "main.py": launch})
    (tmp_path / "main.py").write_text(launch.replace("str(rank)", "'0'"))
    assert ("train.py", "PX103", 3) in lint_tree(tmp_path, {})


BRANCH = ("import os, torch, torch.distributed as dist\ndef run(batch, enable_fsdp):\n"
          "    if enable_fsdp:\n        dist.init_process_group('nccl')\n"
          "        batch = batch.to(int(os.environ['LOCAL_RANK']))\n    else:\n"
          "        batch = batch.to('cuda:0')\n")


def test_cuda_0_on_the_single_process_side_of_the_distributed_setup():
    assert codes(BRANCH, "PX103") == []
    moved = BRANCH.replace("'cuda:0'", "x").replace(
        "int(os.environ['LOCAL_RANK'])", "'cuda:0'")
    assert codes(moved, "PX103") == [("PX103", 5)]  # in the distributed arm


SWITCH = ("import torch, torch.distributed as dist\ndist.init_process_group('nccl')\n"
          "def step(cfg, batch, loss, local_rank):\n"
          "    if torch.cuda.device_count() > 1 and cfg.enable_fsdp:\n"
          "        dist.all_reduce(loss)\n"
          "    if {test}:\n        batch = batch.to(local_rank)\n    else:\n"
          "        batch = batch.to('cuda:0')\n")


def test_a_switch_of_the_distributed_work_has_a_single_process_side():
    assert codes(SWITCH.format(test="cfg.enable_fsdp"), "PX103") == []
    assert codes(SWITCH.format(test="not cfg.enable_fsdp").replace(
        "to(local_rank)", "to('cpu')"), "PX103") == [("PX103", 9)]  # the switch is on there
    # a rank test picks ranks, not a mode: `else` runs on the other ranks
    ranked = SWITCH.replace("torch.cuda.device_count() > 1 and cfg.enable_fsdp",
                            "local_rank == 0")
    assert codes(ranked.format(test="local_rank == 0"), "PX103") == [("PX103", 9)]


def test_the_single_process_branch_helper():
    ctx = Context("s.py", BRANCH)
    hard = next(n for n in ctx.nodes if isinstance(n, ast.Constant) and n.value == "cuda:0")
    branch = single_process_branch(ctx, hard)
    assert isinstance(branch, ast.If) and branch.lineno == 3
    init = next(ctx.calls_named("init_process_group"))
    assert single_process_branch(ctx, init) is None


# 3. PX105 -----------------------------------------------------------------------------------

BATCH = ("for inputs, labels, index, time in loader:\n"
         "    inputs, labels, index = inputs.cuda(), labels.cuda(), index.cuda()\n"
         "    preds = model(inputs, index, time)\n"
         "    acc = (preds.argmax(1) == labels).float().mean()\n")


@pytest.mark.parametrize("use, line", [
    ("    loss = criterion(preds, time)\n", 5),
    ("    shifted = preds + time\n", 5),
    ("    both = torch.cat([inputs, time.float()])\n", 5),
    ("    t = time * 2\n    loss = F.mse_loss(preds, t)\n", 6),
])
def test_an_unmoved_tensor_only_passed_to_the_model(use, line):
    assert codes(BATCH, "PX105") == []
    assert codes(BATCH + use, "PX105") == [("PX105", line)]


def test_sizes_of_an_unmoved_tensor_are_not_its_values():
    loop = "for x, y in loader:\n    x = x.cuda()\n    out = model(x) * y.shape[0]\n"
    assert codes(loop, "PX105") == []
    assert codes(loop.replace("y.shape[0]", "y"), "PX105") == [("PX105", 3)]


# 4. PX201 -----------------------------------------------------------------------------------

ONE_RANK = ("import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n"
            "def main(model, val_ds):\n    dist.init_process_group('nccl')\n"
            "    val_loader = DataLoader(val_ds, batch_size=64)\n"
            "    if dist.get_rank() == 0:\n        for x, y in val_loader:\n"
            "            print(model(x))\n")


def test_a_loader_read_by_one_rank():
    assert codes(ONE_RANK, "PX201") == []
    assert codes(ONE_RANK + "    for x, y in val_loader:\n        pass\n", "PX201") == \
        [("PX201", 5)]


GATHERED = ("import torch, torch.distributed as dist\n"
            "from torch.utils.data import DataLoader, TensorDataset\n"
            "def evaluate(feats, labels):\n    dist.init_process_group('nccl')\n"
            "    all_f = [torch.empty_like(feats) for _ in range(dist.get_world_size())]\n"
            "    dist.all_gather(all_f, feats)\n{more}"
            "    loader = DataLoader(TensorDataset({data}, labels), batch_size=256)\n")


def test_a_loader_of_all_gathered_data_is_replicated_on_purpose():
    assert codes(GATHERED.format(more="", data="torch.cat(all_f)"), "PX201") == []
    assert codes(GATHERED.format(more="    f = torch.cat(all_f)\n    g = f.float()\n",
                                 data="g"), "PX201") == []
    assert codes(GATHERED.format(more="", data="feats"), "PX201") == [("PX201", 7)]


def test_a_helper_that_all_gathers_makes_gathered_data():
    helper = ("import torch, torch.distributed as dist\n"
              "from torch.utils.data import DataLoader, TensorDataset\n"
              "def extract(model, ds):\n    out = [None] * dist.get_world_size()\n"
              "    dist.all_gather_object(out, [model(x) for x in ds])\n    return out\n"
              "def main(model, ds):\n    dist.init_process_group('nccl')\n"
              "    feats = extract(model, ds)\n"
              "    loader = DataLoader(TensorDataset(feats), batch_size=8)\n")
    assert codes(helper, "PX201") == []
    assert codes(helper.replace("TensorDataset(feats)", "ds"), "PX201") == [("PX201", 10)]


# 5. PX701 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("guard", [
    "if 'MASTER_PORT' not in os.environ:",
    "if not os.getenv('MASTER_PORT'):",
    "if os.environ.get('MASTER_PORT') is None:",
    "if port is not None:\n        os.environ['MASTER_PORT'] = str(port)\n"
    "    elif 'MASTER_PORT' in os.environ:\n        pass\n    else:",
])
def test_a_default_for_an_unset_master_port(guard):
    source = f"import os\ndef init(port):\n    {guard}\n        os.environ['MASTER_PORT'] = '29500'\n"
    assert codes(source, "PX701") == []
    line = source.count("\n")
    assert codes(source.replace("'MASTER_PORT' not in", "'MASTER_PORT' in").replace(
        "not os.getenv", "os.getenv").replace("is None", "is not None").replace(
        "in os.environ:\n        pass", "not in os.environ:\n        pass"), "PX701") == \
        [("PX701", line)]


def test_a_default_for_another_variable_is_no_default_for_this_one():
    source = ("import os\nif 'MASTER_ADDR' not in os.environ:\n"
              "    os.environ['MASTER_PORT'] = '29500'\n")
    assert codes(source, "PX701") == [("PX701", 3)]


# 6. PX702 -----------------------------------------------------------------------------------

ARMS = ("import torch, torch.distributed as dist\ndef init():\n"
        "    if torch.cuda.is_available():\n        torch.cuda.set_device(0)\n"
        "        dist.init_process_group('nccl')\n    elif torch.backends.mps.is_available():\n"
        "        dist.init_process_group('gloo')\n    else:\n"
        "        dist.init_process_group('gloo')\ninit()\n")


def test_the_inits_of_one_if_elif_else_are_one_root_cause():
    findings = [f for f in lint_source("s.py", ARMS, ALL) if f.code == "PX702"]
    assert [(f.line, f.related) for f in findings] == [(5, (7, 9))]
    assert "lines 7, 9" in findings[0].message
    # two inits one after the other are not arms of one `if`
    twice = ARMS.replace("    else:\n        dist.init_process_group('gloo')\n",
                         "    dist.init_process_group('gloo')\n")
    assert codes(twice, "PX702") == [("PX702", 5), ("PX702", 8)]


DEAD = ("import torch, torch.distributed as dist\ndef init():\n"
        "    dist.init_process_group('nccl')\ndef unused_helper():\n"
        "    dist.init_process_group('gloo')\n")


def test_an_init_in_a_function_nothing_calls():
    assert codes(DEAD + "init()\n", "PX702") == [("PX702", 3)]
    # the only init, even if nothing here calls it (a library's entry point): kept
    assert codes(DEAD.replace("def init():\n    dist.init_process_group('nccl')\n", ""),
                 "PX702") == [("PX702", 3)]
    assert codes(DEAD + "init()\nunused_helper()\n", "PX702") == [("PX702", 3), ("PX702", 5)]


def test_a_helper_named_like_torchs_init_that_no_linted_file_calls(tmp_path):
    helper = ("import torch, torch.distributed as dist\ndef init_process_group(rank):\n"
              "    torch.cuda.set_device(rank)\n    dist.init_process_group('nccl')\n")
    launch = ("import torch\nfrom utils import distributed as du\ndef run(rank):\n"
              "    torch.cuda.set_device(rank)\n"
              "    torch.distributed.init_process_group('nccl')\n"
              "if __name__ == '__main__':\n    run(0)\n")
    found = lint_tree(tmp_path, {"utils/distributed.py": helper, "launch.py": launch})
    assert {(f, c) for f, c, _ in found if c == "PX702"} == {("launch.py", "PX702")}
    called = launch.replace("if __name__", "    du.init_process_group(rank)\nif __name__")
    found = lint_tree(tmp_path, {"launch.py": called})
    assert ("utils/distributed.py", "PX702", 4) in found
    # when the other file's init is itself in a function nothing calls, both are kept
    found = lint_tree(tmp_path, {"launch.py": launch.split("if __name__")[0]})
    assert {f for f, c, _ in found if c == "PX702"} == {"launch.py", "utils/distributed.py"}


# 7. PX603 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("imports, use", [
    ("import torch.cuda.amp as amp", "amp.GradScaler()"),
    ("from torch.cuda import amp", "amp.autocast(enabled=True)"),
    ("from torch.cuda.amp import autocast", "autocast()"),
    ("from torch.cuda.amp import GradScaler as Scaler", "Scaler()"),
])
def test_the_deprecated_amp_api_through_an_import(tmp_path, imports, use):
    source = f"import torch\n{imports}\nx = {use}\n"
    assert codes(source, "PX603") == [("PX603", 3)]
    # `--fix` leaves it alone (its rewrite would spell `torch.…`), and the file unchanged
    path = tmp_path / "a.py"
    path.write_text(source)
    fixed = fix_file(path, decode(path.read_bytes()), [BY_CODE["PX603"]])
    assert fixed.count == 0 and fixed.text == source


def test_the_new_api_and_an_old_torch_fallback_import_are_not_reported():
    assert codes("import torch.amp as amp\nx = amp.GradScaler('cuda')\n", "PX603") == []
    fallback = ("try:\n    from torch.amp import GradScaler\nexcept ImportError:\n"
                "    from torch.cuda.amp import GradScaler\nx = GradScaler()\n")
    assert codes(fallback, "PX603") == []


def test_fix_still_rewrites_the_spelled_out_api(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("import torch\nimport torch.cuda.amp as amp\n"
                    "s = torch.cuda.amp.GradScaler()\nt = amp.GradScaler()\n")
    fixed = fix_file(path, decode(path.read_bytes()), [BY_CODE["PX603"]])
    assert fixed.count == 1
    assert fixed.text.splitlines()[2:] == ['s = torch.amp.GradScaler("cuda")',
                                           "t = amp.GradScaler()"]


def test_the_cli_reports_the_merged_arms_once(tmp_path):
    (tmp_path / "s.py").write_text(ARMS)
    out = subprocess.run([sys.executable, "-m", "phalanx", "lint", str(tmp_path / "s.py"),
                          "--select", "PX702"], capture_output=True, text=True).stdout
    assert out.count("PX702") == 1 and "the other arms' inits on lines 7, 9" in out
