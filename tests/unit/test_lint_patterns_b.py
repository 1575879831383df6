"""`phalanx lint`'s model of the code against the false positives found on public training
code: facts established in another linted file or through an alias (PX104, PX702,
PX203), a sampler inside `**kwargs` (PX201), batches moved value by value (PX105), RPC
models, fake one-process groups, the old AMP API as a fallback (PX603); then DataParallel
only in a distributed program, loopback MASTER_ADDR, unused FSDP policies, imports
through an unlinted package, evaluation samplers, rank-0-first downloads, datasets split
by rank, opt-in torch.load advice — each silent case next to the true one still found."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.project import build_project
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
    loop = ("for x, y in loader:\n    y = y.to('cpu')\n    loss = loss_fn(model(x), y)\n")
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


# -- the study's second round: each silent case next to the true one ------------------
def test_data_parallel_only_in_a_distributed_program_and_not_as_the_alternative():
    chain = (INIT + "if args.distributed:\n    model = DDP(model)\n"
             "elif torch.cuda.is_available():\n    model = nn.DataParallel(model)\n")
    assert codes(chain, "PX101") == []
    assert codes(INIT + "model = DDP(m) if args.ddp else nn.DataParallel(m)\n", "PX101") == []
    # one process: reported too since issue 47 (the seeds' first pitfall; torch recommends
    # DDP even on one machine), saying the script is single-process
    single = lint_source("t.py", "import torch\nmodel = nn.DataParallel(model)\n",
                         [BY_CODE["PX101"]])
    assert [(f.line, "a single-process script" in f.message) for f in single] == [(2, True)]
    same_arm = INIT + "if args.gpus > 1:\n    model = nn.DataParallel(model)\n"
    assert codes(same_arm, "PX101") == [("PX101", 5)]


def test_data_parallel_in_a_module_of_a_distributed_program(tmp_path):
    """Being distributed flows from an importer down, not up from a module imported."""
    lib = "import torch.nn as nn\n\n\ndef wrap(m):\n    return nn.DataParallel(m)\n"
    train = INIT + "from lib import wrap\nmodel = wrap(model)\n"
    assert ("lib.py", "PX101") in lint_tree(tmp_path / "a", {"lib.py": lib, "train.py": train})
    validate = ("import torch\nimport utils\nmodel = nn.DataParallel(model)\n"
                "acc = utils.evaluate(model)\n")
    utils = INIT.replace("dist.init", "def init():\n    dist.init") + \
        "    torch.cuda.set_device(0)\n    dist.destroy_process_group()\n"
    assert lint_tree(tmp_path / "b", {"utils.py": utils, "validate.py": validate}) == {
        ("validate.py", "PX101")}  # (any script, since issue 47: not through utils.py)


@pytest.mark.parametrize("addr, found", [
    ("localhost", False), ("127.0.0.1", False), ("::1", False), ("10.0.0.7", True)])
def test_a_loopback_master_addr_is_right_for_one_machine(addr, found):
    source = (f"import os\nos.environ['MASTER_ADDR'] = '{addr}'\n"
              "os.environ['MASTER_PORT'] = '12355'\n")
    assert codes(source, "PX701") == [("PX701", 2)] * found + [("PX701", 3)]


POLICIES = ("import torch\nfrom torch.distributed.fsdp import MixedPrecision\n"
            "bf16 = MixedPrecision(param_dtype=torch.bfloat16)\n"
            "bf16_unused = MixedPrecision(param_dtype=torch.bfloat16)\n")


def test_a_16_bit_reduce_policy_only_when_it_is_passed_on(tmp_path):
    train = "import policies\nmodel = FSDP(model, mixed_precision=policies.bf16)\n"
    assert lint_tree(tmp_path, {"policies.py": POLICIES, "train.py": train}) >= {
        ("policies.py", "PX108")}
    lines = [f.line for f in lint_source(str(tmp_path / "policies.py"), POLICIES,
                                         [BY_CODE["PX108"]], build_project(
                                             sorted(tmp_path.glob("*.py"))))]
    assert lines == [3]  # bf16_unused: no linted file reads it
    assert codes(POLICIES, "PX108") == []  # linted alone: nothing uses either
    head = "import torch\n"
    assert codes(head + "m = FSDP(m, mixed_precision=MixedPrecision(param_dtype=torch.half))\n",
                 "PX108") == [("PX108", 2)]
    kwargs = head + "kw = {}\nkw['mp_policy'] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)\n"
    assert codes(kwargs + "fully_shard(m, **kw)\n", "PX108") == [("PX108", 3)]
    assert codes(head + "def policy():\n    return MixedPrecisionPolicy(param_dtype=torch.half)\n",
                 "PX108") == [("PX108", 3)]


LOADER = ("import torch.distributed as dist\nfrom torch.utils.data import DataLoader, "
          "DistributedSampler\n\n\ndef create_loader(ds):\n"
          "    return DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n")


@pytest.mark.parametrize("epoch", ["    loader.sampler.set_epoch(epoch)\n", "    pass\n"])
def test_set_epoch_through_a_package_whose_init_is_not_linted(tmp_path, epoch):
    """`from timm.data import create_loader`: the package's `__init__.py` is not linted,
    so the import reaches the one file of that package that defines the name."""
    train = ("from timm.data import create_loader\nloader = create_loader(ds)\n"
             "for epoch in range(3):\n" + epoch)
    found = lint_tree(tmp_path, {"timm/data/loader.py": LOADER, "train.py": train})
    assert found == (set() if "set_epoch" in epoch else {("timm/data/loader.py", "PX203")})


def test_an_import_resolves_next_to_the_script_first(tmp_path):
    """Two folders with a `utils` package each: `from utils import train` in
    `fsdp/train.py` is `fsdp/utils/`, where the epoch is set."""
    main = ("import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n"
            "from utils import train\nsampler = DistributedSampler(ds)\n"
            "for epoch in range(3):\n    train(model, sampler, epoch)\n")
    files = {"fsdp/train.py": main, "fsdp/utils/__init__.py": "from .steps import train\n",
             "fsdp/utils/steps.py": "def train(model, sampler, epoch):\n"
                                    "    sampler.set_epoch(epoch)\n",
             "ddp/utils/__init__.py": "def train(model, sampler, epoch):\n    pass\n"}
    assert ("fsdp/train.py", "PX203") not in lint_tree(tmp_path, files)
    files["fsdp/utils/steps.py"] = "def train(model, sampler, epoch):\n    pass\n"
    assert ("fsdp/train.py", "PX203") in lint_tree(tmp_path / "again", files)


@pytest.mark.parametrize("sampler, silent", [
    ("eval_sampler = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=eval_sampler)\n",
     True),
    ("s = DistributedSampler(val_set)\nloader = DataLoader(val_set, sampler=s)\n", True),
    ("s = DistributedSampler(ds)\ntestLoader = DataLoader(ds, sampler=s)\n", True),
    ("s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\n"
     "with torch.no_grad():\n    for x in loader:\n        model(x)\n", True),
    ("train_sampler = DistributedSampler(train_ds)\n"
     "loader = DataLoader(train_ds, sampler=train_sampler)\n", False),
    ("s = DistributedSampler(ds)\nloader = DataLoader(ds, sampler=s)\n"
     "for x in loader:\n    model(x).backward()\n", False),
])
def test_an_evaluation_sampler_needs_no_set_epoch(sampler, silent):
    assert codes(INIT + sampler, "PX203") == ([] if silent else [("PX203", 4)])


@pytest.mark.parametrize("wait, release, silent", [
    ("if dist.get_rank() != 0:\n    dist.barrier()\n",
     "if dist.get_rank() == 0:\n    dist.barrier()\n", True),
    ("if args.local_rank not in [-1, 0]:\n    torch.distributed.barrier()\n",
     "if args.local_rank == 0:\n    torch.distributed.barrier()\n", True),
    ("if not is_main_process():\n    wait_all()\n", "if is_main_process():\n    wait_all()\n",
     True),
    ("if dist.get_rank() != 0:\n    dist.barrier()\n", "", False),  # nobody releases them
    ("", "dist.barrier()\n", False),
])
def test_rank_zero_downloads_first_inside_a_barrier_sandwich(wait, release, silent):
    helper = "def wait_all():\n    dist.barrier()\n"
    body = wait + "ds = CIFAR10('data', download=True)\n" + release
    source = INIT + helper + "def load():\n" + "".join(
        "    " + line + "\n" for line in body.splitlines())
    assert [c for c, _ in codes(source, "PX204")] == ([] if silent else ["PX204"])


def test_a_download_inside_main_process_first():
    source = INIT + "with accelerator.main_process_first():\n    ds = MNIST('d', download=True)\n"
    assert codes(source, "PX204") == []
    assert codes(source.replace("main_process_first", "autocast"), "PX204") == [("PX204", 5)]


@pytest.mark.parametrize("dataset, silent", [
    ("Subset(ds, range(len(sampler) * args.world_size, len(ds)))", True),
    ("ds.shard(num_shards=world, index=rank)", True),
    ("split_dataset_by_node(ds, rank=r, world_size=w)", True),
    ("Subset(ds, range(100, len(ds)))", False),
    ("ds", False),
])
def test_a_dataset_already_split_by_rank_needs_no_sampler(dataset, silent):
    direct = INIT + f"loader = DataLoader({dataset}, batch_size=8)\n"
    named = INIT + f"part = {dataset}\nloader = DataLoader(part, batch_size=8)\n"
    assert codes(direct, "PX201") == ([] if silent else [("PX201", 4)])
    assert codes(named, "PX201") == ([] if silent else [("PX201", 5)])


def test_torch_load_advice_is_opt_in():
    from phalanx.cli.lint import chosen_rules
    from phalanx.lint.rules import OPT_IN

    assert {"PX501", "PX502"} <= OPT_IN
    assert not {"PX501", "PX502"} & {r.code for r in chosen_rules("", "")}
    assert {"PX501", "PX502"} <= {r.code for r in chosen_rules("PX5", "")}
