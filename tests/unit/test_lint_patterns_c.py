"""False findings `phalanx lint` had on held-out public training scripts, each next to the
true mistake of the same shape that must still be found: a helper's collectives gated by
its own parameters (lint.gates), a DDP model only where its wrapping reaches
(lint.wrapping), accumulation judged per branch, and torch.save's targets and guards:
callers through their imports, handles and temporary files (lint.targets), closures
and decorators (lint.guards)."""

from __future__ import annotations

import json

import pytest

from phalanx.cli import main
from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE

HEAD = "import torch\nimport torch.distributed as dist\n"
INIT = "dist.init_process_group('nccl')\n"


def found(code: str, source: str) -> list[int]:
    return [f.line for f in lint_source("t.py", HEAD + source, [BY_CODE[code]])]


def project(tmp_path, capsys, code: str, files: dict[str, str]) -> list[tuple[str, int]]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    main(["lint", str(tmp_path), "--format", "json", "--select", code])
    findings = json.loads(capsys.readouterr().out)["findings"]
    return sorted((f["path"].rsplit("/", 1)[-1], f["line"]) for f in findings)


# -- 1. a helper's collective under a test of its own parameter ------------------------
SAVE_STATE = """def save_state(state, path, synchronize=True):
    if synchronize:
        dist.barrier()
    torch.save(state, path)
def save_all(state):
    if dist.get_rank() == 0:
        {call}
    dist.barrier()
"""


@pytest.mark.parametrize("call, lines", [
    ("save_state(state, 'a.pt', synchronize=False)", []),
    ("save_state(state, 'a.pt', False)", []),
    ("save_state(state, 'a.pt')", [9]),  # the default: it synchronizes
    ("save_state(state, 'a.pt', synchronize=True)", [9]),
    ("save_state(state, 'a.pt', synchronize=flag)", [9]),  # unknown: may
    ("save_state(state, 'a.pt', *rest)", [9]),
    ("save_state(state, 'a.pt', **options)", [9]),
])
def test_a_constant_argument_closes_the_helpers_collective(call, lines):
    assert found("PX303", SAVE_STATE.format(call=call)) == lines


def test_gates_of_early_exits_methods_and_helpers_of_helpers():
    early = ("def sync(x, quiet=False):\n    if not quiet:\n        return\n"
             "    dist.barrier()\n"
             "if dist.get_rank() == 0:\n    sync(1)\n")
    assert found("PX303", early) == []
    assert found("PX303", early.replace("sync(1)", "sync(1, quiet=True)")) == [8]
    method = ("class C:\n    def save(self, x, sync=True):\n        if sync is True:\n"
              "            dist.barrier()\n    def run(self):\n"
              "        if dist.get_rank() == 0:\n            self.save(1, False)\n")
    assert found("PX303", method) == []
    assert found("PX303", method.replace("self.save(1, False)", "self.save(1)")) == [9]
    chained = ("def save(x, sync=True):\n    if sync:\n        dist.barrier()\n"
               "def write(x):\n    save(x, sync=False)\n"
               "if dist.get_rank() == 0:\n    write(1)\n")
    assert found("PX303", chained) == []
    assert found("PX303", chained.replace("sync=False", "sync=True")) == [9]
    rebound = ("def save(x, sync=True):\n    sync = sync or x\n    if sync:\n"
               "        dist.barrier()\nif dist.get_rank() == 0:\n    save(1, sync=False)\n")
    assert found("PX303", rebound) == [8]  # the parameter is rebound: unknown


def test_gates_across_linted_files(tmp_path, capsys):
    helper = ("import torch.distributed as dist\n\n"
              "def save(x, synchronize=True):\n    if synchronize:\n        dist.barrier()\n")
    train = ("import torch.distributed as dist\nfrom ckpt import save\n\n"
             "if dist.get_rank() == 0:\n    save(1, synchronize=False)\n"
             "if dist.get_rank() == 0:\n    save(1)\n")
    assert project(tmp_path, capsys, "PX303", {"ckpt.py": helper, "train.py": train}) == \
        [("train.py", 7)]


# -- 2. torch.save: callers, handles, closures, parameters, private targets ------------
def test_callers_resolve_through_the_importing_files_binding(tmp_path, capsys):
    ckpt = HEAD + "def save_checkpoint(state, epoch):\n    torch.save(state, f'c{epoch}.pt')\n" \
        "def mean(t):\n    dist.all_reduce(t)\n"
    train = HEAD + "from ckpt import save_checkpoint\n" + INIT + \
        "if dist.get_rank() == 0:\n    save_checkpoint({}, 1)\n"
    moe = "from ckpt_moe import save_checkpoint\n\ndef main():\n    save_checkpoint({}, 2)\n"
    files = {"ckpt.py": ckpt, "train.py": train, "train_moe.py": moe}
    assert project(tmp_path, capsys, "PX504", files) == []
    for other in ("from ckpt import save_checkpoint\n",  # an unguarded caller of ckpt's
                  "import ckpt as c\nsave_checkpoint = c.save_checkpoint\n"):
        files["train_moe.py"] = other + "\ndef main():\n    save_checkpoint({}, 2)\n"
        assert project(tmp_path, capsys, "PX504", files) == [("ckpt.py", 4)]


HANDLE = INIT + """def rankstr():
    return f"rank_{dist.get_rank()}"
def save(data, save_dir, name):
    path = os.path.join(save_dir, NAME)
    with OPENER(path, "wb") as f:
        torch.save(data, f)
"""


@pytest.mark.parametrize("name, opener, lines", [
    ('f"{name}.{rankstr()}.pth"', "open", []),
    ('f"{name}.{rankstr()}.pth"', "self.path_manager.open", []),
    ('f"{name}.{rank}.pth"', "io.open", []),
    ('f"{name}.pth"', "open", [9]),
    ('f"{name}.pth"', "self.path_manager.open", [9]),
])
def test_a_file_handle_is_followed_to_its_path(name, opener, lines):
    assert found("PX504", HANDLE.replace("NAME", name).replace("OPENER", opener)) == lines


def test_a_closure_defined_after_an_early_exit_runs_on_those_ranks_only():
    source = INIT + ("def add_hooks(model, step):\n    if dist.get_rank() != 0:\n"
                     "        return []\n    def hook(module, args, output):\n"
                     "        torch.save(output, f'traces/{step}.pt')\n"
                     "    return [m.register_forward_hook(hook) for m in model.modules()]\n")
    assert found("PX504", source) == []
    assert found("PX504", source.replace("dist.get_rank() != 0", "step > 10")) == [8]
    guarded_def = INIT + "if dist.get_rank() == 0:\n    def hook():\n        dist.barrier()\n"
    assert found("PX301", guarded_def) == [6]  # a collective in it: those ranks only


PARAM = INIT + """def save_state_dict(ckpt_dir, fname, state):
    torch.save(state, Path(ckpt_dir) / fname)
def save_sharded(ckpt_dir, state):
    save_state_dict(ckpt_dir, f"model/rank{dist.get_rank()}.pt", state)
def save_full(ckpt_dir, state):
    if dist.get_rank() == 0:
        save_state_dict(ckpt_dir, "model.pt", state)
"""


def test_a_file_name_from_a_parameter_every_caller_makes_its_own():
    assert found("PX504", PARAM) == []
    assert found("PX504", PARAM + "save_state_dict('out', 'train.pt', {})\n") == [5]
    assert found("PX504", PARAM.replace("fname, state)", "fname, state, n)")
                 + "save_state_dict('out', fname='x.pt', state={})\n") == [5]


@pytest.mark.parametrize("block, lines", [
    ("with io.BytesIO() as f:\n        torch.save(state, f)", []),
    ("with tempfile.TemporaryDirectory() as d:\n"
     "        torch.save(state, os.path.join(d, 'x.pth'))", []),
    ("with TemporaryDirectory() as d:\n        p = osp.join(d, 'x.pth')\n"
     "        with open(p, 'wb') as f:\n            torch.save(state, f)", []),
    ("d = tempfile.mkdtemp()\n    torch.save(state, os.path.join(d, 'x.pth'))", []),
    ("with tempfile.NamedTemporaryFile() as f:\n        torch.save(state, f.name)", []),
    ("d = tempfile.gettempdir()\n    torch.save(state, os.path.join(d, 'x.pth'))", [5]),
    ("with open('x.pth', 'wb') as f:\n        torch.save(state, f)", [5]),
])
def test_memory_and_temporary_files_are_the_processs_own(block, lines):
    source = INIT + "def save(state):\n    " + block + "\n"
    lines = [n + block.count("\n") for n in lines]  # the save is the block's last line
    assert found("PX504", source) == lines


DECORATED = INIT + """def master_only(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if dist.get_rank() == 0:
            return func(*args, **kwargs)
    return wrapper
@{decorator}
def publish(state):
    torch.save(state, "published.pth")
"""


def test_a_decorator_that_calls_the_function_on_rank_0_only_guards_it():
    assert found("PX504", DECORATED.format(decorator="master_only")) == []
    unguarded = DECORATED.replace("        if dist.get_rank() == 0:\n    ", "")
    assert found("PX504", unguarded.format(decorator="master_only")) == [11]
    assert found("PX301", DECORATED.format(decorator="master_only").replace(
        "torch.save(state, \"published.pth\")", "dist.barrier()")) == [12]


@pytest.mark.parametrize("imports, decorator, guarded", [
    ("from lightning.pytorch.utilities import rank_zero_only", "rank_zero_only", True),
    ("from mmengine.dist import master_only", "master_only", True),
    ("from mmengine.dist import master_only as on_master", "on_master", True),
    ("import lightning.pytorch.utilities as utils", "utils.rank_zero_only", True),
    ("from utils import save as master_only", "master_only", False),  # another, renamed
    ("import os", "master_only", False),  # not imported: an unknown function of that name
])
def test_framework_rank_zero_decorators_when_imported(imports, decorator, guarded):
    source = f"{imports}\n{INIT}@{decorator}\ndef publish(s):\n    torch.save(s, 'p.pth')\n"
    last_line = len((HEAD + source).splitlines())
    assert found("PX504", source) == ([] if guarded else [last_line])


def test_a_decorator_of_another_linted_file(tmp_path, capsys):
    utils = ("import functools\nimport torch.distributed as dist\n\n"
             "def master_only(func):\n    @functools.wraps(func)\n"
             "    def wrapper(*args, **kwargs):\n        if dist.get_rank() == 0:\n"
             "            return func(*args, **kwargs)\n    return wrapper\n\n"
             "def everywhere(func):\n    return func\n")
    hook = HEAD + "from dutils import master_only, everywhere\n" + INIT + \
        "@master_only\ndef a(s):\n    torch.save(s, 'a.pth')\n" \
        "@everywhere\ndef b(s):\n    torch.save(s, 'b.pth')\n"
    assert project(tmp_path, capsys, "PX504", {"dutils.py": utils, "hook.py": hook}) == \
        [("hook.py", 10)]


# -- 3. a DDP model only where its wrapping reaches -----------------------------------
BEFORE_WRAP = INIT + """model = Net().cuda()
if dist.get_rank() == 0:
    out = model(x)
model = DDP(model, device_ids=[0])
"""


def test_a_forward_before_the_ddp_wrap_is_a_plain_modules():
    assert found("PX302", BEFORE_WRAP) == []
    assert found("PX302", BEFORE_WRAP + "if dist.get_rank() == 0:\n    out = model(x)\n") \
        == [9]
    compiled = BEFORE_WRAP + "model = torch.compile(model)\n" \
        "if dist.get_rank() == 0:\n    out = model(x)\n"
    assert found("PX302", compiled) == [10]  # compiled from the wrapper: still DDP
    wrapped_in_branch = INIT + "model = Net()\nif ddp:\n    model = DDP(model)\n" \
        "if dist.get_rank() == 0:\n    out = model(x)\n"
    assert found("PX302", wrapped_in_branch) == [8]


def test_an_fsdp_state_dict_before_the_wrap_is_no_collective():
    source = INIT + "model = Net()\nif dist.get_rank() == 0:\n" \
        "    sd = model.state_dict()\nmodel = FSDP(model)\n"
    assert found("PX301", source) == [] and found("PX303", source) == []
    # after `FSDP(model)` on the default group: proven
    assert found("PX301", source + "if dist.get_rank() == 0:\n    sd = model.state_dict()\n") \
        == [9]
    helper = INIT + "def shard(model):\n    model = FSDP(model)\n    return model\n" \
        "model = shard(Net())\nif dist.get_rank() == 0:\n    sd = model.state_dict()\n"
    assert found("PX301", helper) == [9]  # wrapped by a helper of this file, on the world


# -- 4. accumulation judged per branch ------------------------------------------------
BRANCHES = """model = DDP(net)
for idx, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    if K > 1:
        (loss / K).backward()
        if (idx + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
    else:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("code, lines", [("PX401", [7]), ("PX404", [])])
def test_the_arm_that_steps_every_iteration_is_not_accumulation(code, lines):
    assert found(code, BRANCHES) == lines
    accumulating_else = BRANCHES.replace(
        "        loss.backward()\n        optimizer.step()\n",
        "        loss.backward()\n        if (idx + 1) % K == 0:\n            optimizer.step()\n")
    assert found(code, accumulating_else) == lines + [13]
