"""`phalanx lint`'s model of the code against the false positives found on public training
code: facts established in another linted file or through an alias (PX104, PX702,
PX203), a sampler inside `**kwargs` (PX201), batches moved value by value (PX105), RPC
models, fake one-process groups, the old AMP API as a fallback (PX603) — each silent
case next to the true one that must still be found."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.lint import build_project
from phalanx.lint.engine import lint_source
from phalanx.lint.rules import ALL, BY_CODE

CORPUS = Path(__file__).parents[1] / "lint_corpus"
INIT = "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"


def codes(source: str, *wanted: str) -> list[tuple[str, int]]:
    rules = [BY_CODE[c] for c in wanted] if wanted else ALL
    return [(f.code, f.line) for f in lint_source("s.py", source, rules)]


def lint_tree(root: Path, files: dict[str, str]) -> set[tuple[str, str]]:
    """(file, code) of every finding when the files are linted together, as the CLI does."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    paths = sorted(root.rglob("*.py"))
    project = build_project(paths)
    return {(p.relative_to(root).as_posix(), f.code) for p in paths
            for f in lint_source(str(p), p.read_text(), ALL, project)}


@pytest.mark.parametrize("chooses", [
    "torch.cuda.set_device(local_rank)\n",
    "device_module = torch.get_device_module('cuda')\ndevice_module.set_device(local_rank)\n",
    "torch.get_device_module(device).set_device(local_rank)\n",
    "torch.accelerator.set_device_index(local_rank)\n",
    "with torch.cuda.device(local_rank):\n    pass\n",
    "os.environ['CUDA_VISIBLE_DEVICES'] = str(local_rank)\n",
])
def test_the_device_chosen_through_an_alias(chooses):
    assert codes(INIT + "x = torch.zeros(1).cuda()\n", "PX104") == [("PX104", 3)]
    assert codes(INIT + chooses + "x = torch.zeros(1).cuda()\n", "PX103", "PX104") == []


def test_the_group_destroyed_or_registered_for_exit():
    assert codes(INIT, "PX702") == [("PX702", 3)]
    assert codes(INIT + "import atexit\natexit.register(dist.destroy_process_group)\n",
                 "PX702") == []


SETUP = ("import os\nimport torch\nimport torch.distributed as dist\n\n\n"
         "def setup():\n"
         "    dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n"
         "    return int(os.environ['LOCAL_RANK'])\n")
ENTRY = ("import torch\nimport torch.distributed as dist\nfrom {module} import setup\n\n"
         "rank = setup()\ntorch.cuda.set_device(rank)\ntry:\n    pass\nfinally:\n"
         "    dist.destroy_process_group()\n")


@pytest.mark.parametrize("layout", [
    {"dist_utils.py": SETUP, "train.py": ENTRY.format(module="dist_utils")},
    {"pkg/__init__.py": "", "pkg/dist_utils.py": SETUP,
     "pkg/train.py": ENTRY.format(module=".dist_utils")},
    {"pkg/__init__.py": "", "pkg/dist_utils.py": SETUP,
     "train.py": ENTRY.format(module="pkg.dist_utils")},
])
def test_set_device_and_destroy_in_the_file_that_imports_the_setup(tmp_path, layout):
    """init in dist_utils.py, set_device and destroy in the script that imports it: no
    PX104/PX702 when both are linted; the setup file alone is reported."""
    assert lint_tree(tmp_path, layout) == set()
    setup = next(p for p in layout if p.endswith("dist_utils.py"))
    assert {f.code for f in lint_source(setup, SETUP, ALL)} == {"PX104", "PX702"}


def test_facts_do_not_cross_between_unconnected_files(tmp_path):
    """Two entry scripts sharing a module: one destroying its group does not excuse the
    other; a file that imports nothing of the other is not connected to it."""
    other = INIT + "torch.cuda.set_device(0)\n"
    found = lint_tree(tmp_path, {
        "common.py": "import torch\n",
        "a.py": "import common\n" + other + "dist.destroy_process_group()\n",
        "b.py": "import common\n" + other,
        "c.py": INIT + "x = torch.zeros(1).cuda(0)\n"})
    assert found == {("b.py", "PX702"), ("c.py", "PX104"), ("c.py", "PX702")}


SAMPLER = ("import torch.distributed as dist\nfrom torch.utils.data import DataLoader, "
           "DistributedSampler\n\n\ndef make_loader(ds):\n"
           "    return DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n")


@pytest.mark.parametrize("sets_epoch", [
    "    loader.sampler.set_epoch(epoch)\n",
    "    loader.batch_sampler.sampler.set_epoch(epoch)\n",
    "    start_epoch(loader, epoch)\n",
])
def test_set_epoch_in_another_linted_file(tmp_path, sets_epoch):
    helper = "from data import make_loader\n\n\ndef start_epoch(dl, e):\n" \
             "    dl.sampler.set_epoch(e)\n"
    train = ("from data import make_loader\nfrom helpers import start_epoch\n"
             "loader = make_loader(ds)\nfor epoch in range(3):\n" + sets_epoch)
    assert lint_tree(tmp_path, {"data.py": SAMPLER, "train.py": train,
                                "helpers.py": helper}) == set()
    assert codes(SAMPLER, "PX203") == [("PX203", 6)]
    unrelated = lint_tree(tmp_path / "u", {"data.py": SAMPLER, "other.py": helper.replace(
        "from data import make_loader\n", "")})
    assert unrelated == {("data.py", "PX203")}


def test_set_epoch_in_a_sibling_module_of_the_same_program(tmp_path):
    """data.py builds the sampler, engine.py's train_one_epoch sets the epoch of the
    loader it is given, train.py imports both: one program, no PX203."""
    engine = "def train_one_epoch(model, loader, epoch):\n    loader.sampler.set_epoch(epoch)\n"
    train = ("from data import make_loader\nfrom engine import train_one_epoch\n"
             "loader = make_loader(ds)\nfor epoch in range(3):\n"
             "    train_one_epoch(model, loader, epoch)\n")
    assert lint_tree(tmp_path, {"data.py": SAMPLER, "engine.py": engine,
                                "train.py": train}) == set()
    alone = lint_tree(tmp_path / "other", {"data.py": SAMPLER, "engine.py": engine})
    assert alone == {("data.py", "PX203")}


@pytest.mark.parametrize("kwargs, found", [
    ("kw = dict(batch_size=8, sampler=DistributedSampler(ds))\n", []),
    ("kw = {'batch_size': 8, 'batch_sampler': bs}\n", []),
    ("kw = config.loader_kwargs()\n", []),  # a mapping not seen into
    ("kw = dict(batch_size=8)\nkw['sampler'] = DistributedSampler(ds)\n", []),
    ("kw = {'batch_size': 8, **extra}\n", []),
    ("kw = dict(batch_size=8, shuffle=True)\n", [("PX201", 5)]),  # seen: no sampler
    ("kw = {'batch_size': 8}\n", [("PX201", 5)]),
])
def test_a_sampler_inside_kwargs(kwargs, found):
    source = INIT + kwargs + "loader = DataLoader(ds, **kw)\n"
    line = source.count("\n")
    assert codes(source, "PX201", "PX202") == [(c, line) for c, _ in found]


def test_kwargs_of_the_caller_may_hold_the_sampler():
    source = INIT + "def make(ds, **kw):\n    return DataLoader(ds, **kw)\n"
    assert codes(source, "PX201", "PX202") == []


@pytest.mark.parametrize("moves", [
    "    x = {k: v.to(device) for k, v in x.items()}\n",
    "    for k in x:\n        x[k] = x[k].to(device)\n",
    "    for k, v in x.items():\n        x[k] = v.to(device)\n",
    "    x = to_device(x, device)\n",
    "    x, y = x.cuda(), y\n",
])
def test_a_batch_moved_value_by_value(moves):
    loop = "for x, y in loader:\n{moves}    loss = loss_fn(model(x), y.to(device))\n"
    assert codes(loop.format(moves=""), "PX105") == [("PX105", 2)]
    assert codes(loop.format(moves=moves), "PX105") == []


def test_a_tuple_assignment_moves_only_what_it_moves():
    source = "for x, y in loader:\n    x, y = x.to(device), y\n    loss = loss_fn(model(x), y)\n"
    assert codes(source, "PX105") == [("PX105", 3)]


def test_a_model_driven_through_rpc_takes_cpu_inputs():
    loop = ("for x, y in loader:\n    y = y.to('cpu')\n    out = model(x, y)\n")
    assert codes(loop, "PX105") == [("PX105", 3)]
    rpc = "import torch.distributed.rpc as rpc\nmodel = rpc.remote('ps', Net)\n"
    assert codes(rpc + loop, "PX105") == []
    hard = INIT + "from torch.distributed.rpc import RRef\nx = x.to('cuda:0')\n"
    assert codes(hard, "PX103") == []
    assert codes(hard.replace("torch.distributed.rpc", "utils"), "PX103") == [("PX103", 5)]


@pytest.mark.parametrize("init", [
    "dist.init_process_group(backend='fake', rank=0, world_size=1, store=FakeStore())\n",
    "dist.init_process_group('fake', rank=0, world_size=4, store=store)\n",
    "store = FakeStore()\ndist.init_process_group('gloo', rank=0, world_size=1, store=store)\n",
    "dist.init_process_group('gloo', rank=0, world_size=1, store=dist.HashStore())\n",
])
def test_a_fake_one_process_group_is_no_distributed_script(init):
    body = "x = torch.zeros(1).cuda()\nloader = DataLoader(ds, batch_size=8)\n"
    source = "import torch\nimport torch.distributed as dist\n" + init + body
    assert codes(source, "PX104", "PX201", "PX702") == []
    real = source.replace("'fake'", "'nccl'").replace("world_size=1", "world_size=2")
    assert {c for c, _ in codes(real, "PX104", "PX201", "PX702")} == \
        {"PX104", "PX201", "PX702"}


@pytest.mark.parametrize("fallback", [
    "try:\n    from torch.amp import GradScaler\nexcept ImportError:\n"
    "    GradScaler = torch.cuda.amp.GradScaler\n",
    "try:\n    autocast = torch.autocast\nexcept AttributeError:\n"
    "    autocast = torch.cuda.amp.autocast\n",
    "if hasattr(torch, 'amp'):\n    GradScaler = torch.amp.GradScaler\nelse:\n"
    "    GradScaler = torch.cuda.amp.GradScaler\n",
    "if version.parse(torch.__version__) < version.parse('2.3'):\n"
    "    GradScaler = torch.cuda.amp.GradScaler\nelse:\n    GradScaler = torch.amp.GradScaler\n",
])
def test_the_old_amp_api_as_a_fallback_for_an_older_torch(fallback):
    assert codes("import torch\n" + fallback, "PX603") == []
    assert codes("import torch\nscaler = torch.cuda.amp.GradScaler()\n", "PX603") == \
        [("PX603", 2)]
    other = fallback.replace("ImportError", "ValueError").replace("AttributeError",
                                                                  "ValueError")
    if "ValueError" in other:  # a handler for another error is no fallback
        assert [c for c, _ in codes("import torch\n" + other, "PX603")] == ["PX603"]


def test_data_parallel_is_a_warning_not_an_error():
    """Slow and single-node, but it computes the right thing: not an error."""
    assert BY_CODE["PX101"].severity == "warning"
    for code in ("PX102", "PX106", "PX107", "PX202", "PX505", "PX601", "PX706"):
        assert BY_CODE[code].severity == "error", code  # a crash or a wrong result


def test_the_corpus_project_files_are_silent_together_and_not_alone():
    paths = sorted(CORPUS.glob("*.py"))
    project = build_project(paths)
    together = [f for p in paths if p.name.startswith("fpb_")
                for f in lint_source(str(p), p.read_text(), ALL, project)]
    assert together == []
    alone = CORPUS / "fpb_dist_utils.py"
    assert {f.code for f in lint_source(str(alone), alone.read_text(), ALL)} == \
        {"PX104", "PX702", "PX203"}


def test_fix_leaves_the_old_torch_fallback_alone(tmp_path):
    """`--fix` rewrites what PX603 finds: the fallback for an older torch is not found,
    so it is not rewritten into an API that torch does not have."""
    import subprocess
    import sys

    path = tmp_path / "amp.py"
    path.write_text("import torch\ntry:\n    from torch.amp import GradScaler\n"
                    "except ImportError:\n    GradScaler = torch.cuda.amp.GradScaler\n"
                    "scaler = torch.cuda.amp.GradScaler()\n")
    diff = subprocess.run([sys.executable, "-m", "phalanx", "lint", str(path), "--diff"],
                          capture_output=True, text=True, timeout=60).stdout
    added = [line for line in diff.splitlines() if line[:1] == "+" and line[:3] != "+++"]
    assert added == ['+scaler = torch.amp.GradScaler("cuda")']
