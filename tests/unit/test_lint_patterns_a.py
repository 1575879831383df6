"""False positives `phalanx lint` had on public training scripts, each next to the true
mistake of the same shape that must still be found: helpers resolved by qualified name,
accumulation read from an optimizer's step only, rank guards from early exits and from
callers, Phalanx's own `Run`, PX801 per scope and per root cause, PX502 on an explicit
`weights_only=False` only."""

from __future__ import annotations

import inspect
import json

import pytest

from phalanx.cli import main
from phalanx.lint import fix as fixmod
from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE
from phalanx.lint.runapi import RUN_COLLECTIVES, RUN_LOCAL
from phalanx.runtime.run import Run

HEAD = "import torch\nimport torch.distributed as dist\n"


def found(code: str, source: str) -> list[int]:
    return [f.line for f in lint_source("t.py", HEAD + source, [BY_CODE[code]])]


# -- 1. a call resolves to the function it names --------------------------------------
CHECKPOINTER = """class Checkpointer:
    def save(self, state):
        dist.all_gather_object(self.parts, state)
    def finish(self, state):
        if dist.get_rank() == 0:
            {call}
"""


def test_torch_save_is_torchs_not_a_local_method_named_save():
    assert found("PX301", CHECKPOINTER.format(call="torch.save(state, 'c.pt')")) == []
    # (a method: not proven to be this class's, so the suspicion tier)
    assert found("PX303", CHECKPOINTER.format(call="self.save(state)")) == [8]


def test_a_method_is_its_own_classs_not_another_classs():
    source = ("class A:\n    def sync(self, x):\n        dist.all_reduce(x)\n"
              "class B:\n    def sync(self, x):\n        return x\n"
              "    def log(self, x):\n        if dist.get_rank() == 0:\n"
              "            self.sync(x)\n")
    assert found("PX301", source) == []
    assert found("PX301", source.replace("        return x\n", "        A().sync(x)\n"
                                         "        dist.barrier()\n")) == []
    assert found("PX303", source.replace("        return x\n", "        A().sync(x)\n"
                                         "        dist.barrier()\n")) == [12]


def test_a_local_function_named_like_a_collective_is_not_one():
    source = "def gather(xs):\n    return list(xs)\nif dist.get_rank() == 0:\n    gather(x)\n"
    assert found("PX301", source) == []
    assert found("PX301", source.replace("    gather(x)", "    dist.gather(x)")) == [6]


def test_module_functions_resolve_through_the_module_imported(tmp_path, capsys):
    (tmp_path / "utils.py").write_text("import torch.distributed as dist\n\n\n"
                                       "def save(x):\n    dist.barrier()\n\n\n"
                                       "def mean(x):\n    dist.all_reduce(x)\n")
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\nimport utils\n\n"
        "if dist.get_rank() == 0:\n    torch.save(x, 'c.pt')\n    utils.mean(x)\n")
    main(["lint", str(tmp_path), "--format", "json", "--select", "PX303"])  # (another file's)
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["line"], "in utils.py" in f["message"]) for f in findings] == [(7, True)]


# -- 2. accumulation: an optimizer stepped under `%` in the backward's loop ------------
LOOP = """model = DDP(net)
optimizer = torch.optim.AdamW(model.parameters())
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
for i, (x, y) in enumerate(loader):
    loss = loss_fn(model(x), y)
    loss.backward()
    if {test}:
        {stepped}.step()
"""


@pytest.mark.parametrize("code", ["PX401", "PX404"])
def test_a_scheduler_stepped_every_few_epochs_is_not_accumulation(code):
    assert found(code, LOOP.format(test="i % val_every == 0", stepped="scheduler")) == []
    assert found(code, LOOP.format(test="(i + 1) % 4 == 0", stepped="optimizer")) == [8]


def test_the_off_by_one_needs_an_optimizers_step():
    assert found("PX403", LOOP.format(test="i % 4 == 0", stepped="scheduler")) == []
    assert found("PX403", LOOP.format(test="i % 4 == 0", stepped="optimizer")) == [9]


def test_a_backward_of_another_loop_is_not_in_the_accumulation():
    source = LOOP.format(test="(i + 1) % 4 == 0", stepped="optimizer") + \
        "for x in warmup:\n    model(x).sum().backward()\n    optimizer.step()\n"
    assert found("PX404", source) == [8]


def test_a_loss_divided_by_the_helper_that_computes_it():
    helper = ("def compute_loss(model, x, y):\n    loss = loss_fn(model(x), y)\n"
              "    return loss / accum_steps\n")
    source = helper + LOOP.format(test="(i + 1) % 4 == 0", stepped="optimizer").replace(
        "loss = loss_fn(model(x), y)", "loss = compute_loss(model, x, y)")
    assert found("PX404", source) == []
    assert found("PX404", source.replace("loss / accum_steps", "loss")) == [11]


# -- 3. rank guards: early exits and callers -----------------------------------------
def test_a_collective_after_an_early_return_is_a_deadlock():
    source = ("def finish(x):\n    if dist.get_rank() != 0:\n        return\n"
              "    dist.barrier()\n")
    found_ = lint_source("t.py", HEAD + source, [BY_CODE["PX301"]])
    assert [f.line for f in found_] == [6] and "return` at line 4" in found_[0].message
    joined = source.replace("        return\n", "        dist.barrier()\n        return\n")
    assert found("PX301", joined) == []  # the leaving ranks join it on their way out
    raised = source.replace("        return\n", "        raise SystemError('stop')\n")
    assert found("PX301", raised) == []  # a rank that fails ends the whole job


@pytest.mark.parametrize("source", [
    # "is this a distributed run?" is the same on every rank (build-nanogpt)
    "ddp = int(os.environ.get('RANK', -1)) != -1\nif ddp:\n    dist.all_reduce(x)\n",
    # work split over ranks: every rank goes on through the loop (build-nanogpt's eval)
    "model = DDP(net)\nfor i, x in enumerate(xs):\n    if i % world != dist.get_rank():\n"
    "        continue\n    model(x)\n",
])
def test_tests_that_every_rank_passes_are_no_rank_guard(source):
    assert found("PX301", source) == []


def test_a_name_holding_the_rank_guards_like_the_rank():
    """pytorch/examples' multigpu_torchrun.py: `self.gpu_id = int(os.environ[
    "LOCAL_RANK"])`, then `if self.gpu_id == 0 and ...: self._save_snapshot(epoch)`."""
    source = ("dist.init_process_group('nccl')\nclass Trainer:\n    def __init__(self):\n"
              "        self.gpu_id = int(os.environ['LOCAL_RANK'])\n"
              "    def _save_snapshot(self, epoch):\n        torch.save(self.state, 'snap.pt')\n"
              "    def train(self, epochs):\n        for epoch in range(epochs):\n"
              "            if self.gpu_id == 0 and epoch % 10 == 0:\n"
              "                self._save_snapshot(epoch)\n")
    assert found("PX504", source) == []
    assert found("PX504", source.replace("self.gpu_id == 0 and ", "")) == [8]


SAVE = "def save_ckpt(state):\n    torch.save(state, {target})\n"


@pytest.mark.parametrize("source", [
    "def save(state):\n    if not is_main:\n        return\n    torch.save(state, 'c.pt')\n",
    SAVE.format(target="'c.pt'") + "if dist.get_rank() == 0:\n    save_ckpt(s)\n",
    SAVE.format(target="f'ckpt_{rank}.pt'") + "save_ckpt(s)\n",
    SAVE.format(target="'ckpt' + str(dist.get_rank())") + "save_ckpt(s)\n",
    SAVE.format(target="io.BytesIO()") + "save_ckpt(s)\n",
    "buf = io.BytesIO()\n" + SAVE.format(target="buf") + "save_ckpt(s)\n",
    "def save_ckpt(state):\n    path = f'{d}/{rank}.pt'\n    torch.save(state, path)\n",
])
def test_saving_on_one_rank_or_to_a_per_rank_file_is_not_on_every_rank(source):
    source = "dist.init_process_group('nccl')\n" + source
    assert found("PX504", source) == []


def test_saving_from_a_helper_that_every_rank_calls_is_found():
    source = ("dist.init_process_group('nccl')\n" + SAVE.format(target="'c.pt'")
              + "if dist.get_rank() == 0:\n    save_ckpt(s)\nsave_ckpt(s)\n")
    assert found("PX504", source) == [5]
    escaped = SAVE.format(target="'c.pt'") + "mp.spawn(save_ckpt)\n"  # called from anywhere
    assert found("PX504", "dist.init_process_group('nccl')\n" + escaped) == [5]


@pytest.mark.parametrize("code, call", [
    ("PX501", "torch.load('c.pt')"),
    ("PX204", "MNIST('data', download=True)"),
    ("PX201", "DataLoader(val_set, batch_size=8)"),
])
def test_work_in_a_helper_called_only_on_rank_0(code, call):
    source = (f"dist.init_process_group('nccl')\ndef rank0_only():\n    return {call}\n"
              "if dist.get_rank() == 0:\n    rank0_only()\n")
    assert found(code, source) == []
    assert found(code, source + "rank0_only()\n") == [5]


def _lint_dir(capsys, path, code: str) -> list[tuple[str, int]]:
    main(["lint", str(path), "--format", "json", "--select", code])
    return [(f["path"].rsplit("/", 1)[-1], f["line"])
            for f in json.loads(capsys.readouterr().out)["findings"]]


def test_a_helper_of_another_file_called_only_on_rank_0(tmp_path, capsys):
    """DeepSpeed-Chat's save_hf_format: defined in utils.py, called under
    `if args.global_rank == 0:` by every training script."""
    (tmp_path / "utils.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n\n"
        "def save_hf_format(model, path):\n    torch.save(model.state_dict(), path)\n\n\n"
        "def world():\n    return dist.get_world_size()\n")
    for script in ("step1.py", "step2.py"):
        (tmp_path / script).write_text(
            "import torch.distributed as dist\nfrom utils import save_hf_format\n\n"
            "dist.init_process_group('nccl')\nif dist.get_rank() == 0:\n"
            "    save_hf_format(model, 'out.bin')\n")
    assert _lint_dir(capsys, tmp_path, "PX504") == []
    (tmp_path / "step3.py").write_text(  # one script saves on every rank
        "import torch.distributed as dist\nimport utils\n\n"
        "dist.init_process_group('nccl')\nutils.save_hf_format(model, 'out.bin')\n")
    assert _lint_dir(capsys, tmp_path, "PX504") == [("utils.py", 6)]
    (tmp_path / "step3.py").write_text("from . import utils\nutils.save_hf_format(m, 'o')\n")
    assert _lint_dir(capsys, tmp_path, "PX504") == [("utils.py", 6)]  # a caller not followed


LOCAL = ("import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
         "def save(state):\n    if {test}:\n        return\n    torch.save(state, 'c.pt')\n")


def test_a_job_wide_save_after_a_local_rank_early_return():
    assert found("PX802", LOCAL.format(test="local_rank != 0")) == [8]
    assert found("PX802", LOCAL.format(test="dist.get_rank() != 0")) == []
    caller = ("import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
              "def checkpoint(state):\n    torch.save(state, 'c.pt')\nif local_rank == 0:\n"
              "    checkpoint(s)\n")
    assert found("PX802", caller) == [6]


# -- 4. Phalanx's own Run --------------------------------------------------------------
RUN = "import phalanx\nrun = phalanx.init()\nif run.is_main:\n    {call}\n"


@pytest.mark.parametrize("call, what", [
    ("run.log(step, loss=loss)", "`run.log()` (all-reduces the metrics)"),
    ("run.save('ckpt', step, model)", "`run.save()`"),
    ("state = run.full_state_dict(model)", "`run.full_state_dict()`"),
    ("print(run.all_reduce_mean(loss))", "`run.all_reduce_mean()` (an all-reduce)"),
    ("run.barrier()", "`run.barrier()`"),
])
def test_runs_collectives_under_a_rank_condition(call, what):
    findings = lint_source("t.py", RUN.format(call=call), [BY_CODE["PX301"]])
    assert [f.line for f in findings] == [4] and what in findings[0].message


@pytest.mark.parametrize("call", ["run.log(step, reduce=None, loss=loss)", "run.print(loss)",
                                  "torch.save(run.unwrap(model).state_dict(), 'm.pt')"])
def test_runs_local_calls_under_a_rank_condition(call):
    assert lint_source("t.py", RUN.format(call=call), [BY_CODE["PX301"]]) == []


def test_a_run_from_an_imported_init():
    source = "from phalanx import init\nr = init()\nif r.is_main:\n    r.export(model, 'out')\n"
    assert [f.line for f in lint_source("t.py", source, [BY_CODE["PX301"]])] == [4]


def test_every_public_run_method_is_classified():
    """A new public method of `Run` must say whether it runs a collective."""
    methods = {name for name, member in inspect.getmembers(Run)
               if not name.startswith("_") and callable(member)
               and not isinstance(inspect.getattr_static(Run, name), property)}
    assert methods - RUN_COLLECTIVES.keys() - RUN_LOCAL == set()
    assert (RUN_COLLECTIVES.keys() | RUN_LOCAL) - methods == set()  # no stale entry
    assert not RUN_COLLECTIVES.keys() & RUN_LOCAL


# -- 5. PX801 per scope, one finding per root cause ----------------------------------
def test_the_global_rank_as_a_device_is_judged_per_scope():
    source = ("def setup():\n    return 0\ndef other():\n    rank = setup()\n"
              "def main():\n    rank = dist.get_rank()\n"
              "    torch.accelerator.set_device_index(rank)\n"
              "    model = DDP(net.to(rank), device_ids=[rank])\n")
    findings = lint_source("t.py", HEAD + source, [BY_CODE["PX801"]])
    assert [(f.line, f.related) for f in findings] == [(9, (10,))]
    assert "also line 10" in findings[0].message


def test_a_rank_passed_to_a_function_is_the_callers_root_cause():
    """pytorch/examples' ddp/example.py: main() sets the device from the global rank, then
    passes it to demo_basic(rank), which places the model by it: one error, at main's
    set_device_index (it crashes first), naming demo_basic's lines."""
    source = ("def demo(rank):\n    model = Net().to(rank)\n    DDP(model, device_ids=[rank])\n"
              "def main():\n    rank = int(os.environ['RANK'])\n"
              "    torch.accelerator.set_device_index(rank)\n    demo(rank)\n")
    findings = lint_source("t.py", HEAD + source, [BY_CODE["PX801"]])
    assert [(f.line, f.related) for f in findings] == [(8, (4, 5))]
    assert found("PX801", source + "demo(0)\n") == [8]  # another caller passes a GPU index


@pytest.mark.parametrize("source", [
    "rank = dist.get_rank()\ndef main(rank):\n    torch.cuda.set_device(rank)\n",
    "def log():\n    rank = dist.get_rank()\n    print(rank)\n"
    "def place():\n    rank = int(os.environ['LOCAL_RANK'])\n    torch.cuda.set_device(rank)\n",
])
def test_a_parameter_or_another_functions_rank_is_not_judged(source):
    assert found("PX801", source) == []


# -- 6. PX502: only an explicit weights_only=False -----------------------------------
def test_weights_only_false_is_found_and_never_rewritten():
    source = ("a = torch.load('a.pt')\nb = torch.load('b.pt', weights_only=True)\n"
              "c = torch.load('c.pt', weights_only=False)\n")
    assert found("PX502", source) == [5]
    assert fixmod._edits("t.py", HEAD + source, [BY_CODE["PX502"]]) == ([], [], 0)


# -- 7. the study's false findings, next to the true ones of the same shape -----------
EVAL = ("model = DDP(net)\n@torch.no_grad()\ndef estimate_loss():\n    return model(x)\n"
        "if step % 100 == 0 and master_process:\n    losses = estimate_loss()\n")


def test_a_ddp_forward_on_one_rank_is_a_warning_not_an_error():
    """nanoGPT's estimate_loss() under `master_process`: a deadlock only when the model has
    buffers (PX302); a helper that also all-reduces stays an error (PX301)."""
    assert found("PX301", EVAL) == [] and found("PX302", EVAL) == [8]
    assert found("PX302", EVAL.replace("model(x)", "model.module(x)")) == []
    both = EVAL.replace("    return model(x)", "    dist.all_reduce(x)\n    return model(x)")
    assert found("PX303", both) == [9] and found("PX302", both) == []  # master_process: unknown
    known = both.replace("if step", "master_process = dist.get_rank() == 0\nif step")
    assert found("PX301", known) == [10] and found("PX303", known) == []


SYNC = ("for micro_step in range(accum):\n    model.require_backward_grad_sync = {value}\n"
        "    loss.backward()\n")


def test_the_private_sync_flag_set_per_micro_step_is_no_syncs_semantics():
    assert found("PX402", SYNC.format(value="(micro_step == accum - 1)")) == []
    assert found("PX402", SYNC.format(value="False")) == [4]  # left off
    assert found("PX402", "model.require_backward_grad_sync = flag\n") == [3]  # not in a loop


WRAPPED = ("model = Net()\nmodel = DDP(model)\ndef save():\n"
           "    torch.save({'model': model.state_dict()}, 'ckpt.pt')\n")


@pytest.mark.parametrize("source", [
    "model = Net()\nsd = model.state_dict()\ntorch.save(sd, 'n.pt')\nmodel = DDP(model)\n",
    "model = DDP(net)\nclass GPT:\n    @classmethod\n    def load(cls):\n"
    "        model = GPT()\n        torch.save(model.state_dict(), 'g.pt')\n",  # a local
    "model = DDP(net)\nshapes = {k: v.shape for k, v in model.state_dict().items()}\n",
    WRAPPED + "def load(sd):\n    return {k.replace('module.', ''): v "
    "for k, v in sd.items()}\n",  # the project strips the prefix: on purpose
])
def test_the_wrappers_state_dict_not_saved_or_not_the_wrapper_is_not_found(source):
    assert found("PX503", source) == []


def test_the_wrappers_state_dict_saved_is_found():
    assert found("PX503", WRAPPED) == [6]
    helper = ("model = DDP(net)\ndef save_checkpoint(state, path):\n    torch.save(state, path)\n"
              "state = {'state_dict': model.state_dict()}\nsave_checkpoint(state, 'c.pt')\n")
    assert found("PX503", helper) == [6]


def test_the_prefix_stripped_in_another_linted_file(tmp_path, capsys):
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(net)\ntorch.save(model.state_dict(), 'm.pt')\n")
    (tmp_path / "other.py").write_text("x = 1\n")
    assert _lint_dir(capsys, tmp_path, "PX503") == [("train.py", 4)]
    (tmp_path / "other.py").write_text("def load(sd):\n    return {k[len('module.'):]: v "
                                       "for k, v in sd.items()}\n")
    assert _lint_dir(capsys, tmp_path, "PX503") == []


@pytest.mark.parametrize("body, lines", [
    ("def shard_name():\n    return f'optim_rank{dist.get_rank()}.pt'\n"
     "torch.save(x, shard_name())\n", []),
    ("class S:\n    def _path(self):\n        return f'o{dist.get_rank()}.pt'\n"
     "    def save(self, x):\n        torch.save(x, self._path())\n", []),
    ("def shard_name():\n    return 'optim.pt'\ntorch.save(x, shard_name())\n", [6]),
])
def test_a_per_rank_file_name_from_a_helper(body, lines):
    assert found("PX504", "dist.init_process_group('nccl')\n" + body) == lines


TRAINER = ("class Trainer:\n    def __init__(self, rank):\n        self.local_rank = {value}\n"
           "    def _save(self):\n        torch.save(self.state, 'snap.pt')\n"
           "    def train(self, epoch):\n        if self.local_rank == 0 and epoch % 5 == 0:\n"
           "            self._save()\n")


def test_a_local_rank_guard_through_attributes_modulo_and_callers():
    """minGPT-ddp's trainer (`self.local_rank == 0 and ...` around `_save_snapshot`) and
    imagenet's `args.rank % ngpus_per_node == 0`: once per node, not once per job."""
    assert found("PX802", TRAINER.format(value="int(os.environ['LOCAL_RANK'])")) == [7]
    assert found("PX802", TRAINER.format(value="int(os.environ['RANK'])")) == []
    imagenet = ("def save_checkpoint(state):\n    torch.save(state, 'c.pt')\n"
                "def main_worker(gpu, ngpus_per_node, args):\n"
                "    if not args.multiprocessing_distributed or ("
                "args.multiprocessing_distributed and args.rank % ngpus_per_node == 0):\n"
                "        save_checkpoint(s)\n")
    assert found("PX802", imagenet) == [4]
    assert found("PX802", imagenet.replace(" % ngpus_per_node", "")) == []


def test_a_parameter_every_caller_passes_a_rank_is_a_rank():
    """ddp-tutorial-series multigpu.py: `Trainer(model, data, rank)` stores the rank as
    `self.gpu_id`; `if self.gpu_id == 0: self._save_checkpoint()` saves on one rank."""
    source = ("dist.init_process_group('nccl')\nclass Trainer:\n"
              "    def __init__(self, gpu_id):\n        self.gpu_id = gpu_id\n"
              "    def _save(self):\n        torch.save(self.state, 'c.pt')\n"
              "    def train(self):\n        if self.gpu_id == 0:\n            self._save()\n"
              "def main(rank):\n    Trainer({arg}).train()\n")
    assert found("PX504", source.format(arg="rank")) == []
    assert found("PX504", source.format(arg="0")) == [8]
