"""A hang or abort report cites `phalanx lint`'s finding for where the ranks parted when
the stacks only show where they met (hang.static): in the job failure of a rank gloo
aborted, and in the watchdog's report; not when the stacks already name the rank
condition, nor when lint finds nothing."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.hang.crash import crash_file
from phalanx.hang.diagnosis import build_report
from phalanx.hang.stacks import Frame
from phalanx.hang.static import static_citation
from phalanx.launch.failures import job_failed

TRAIN = '''import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from evaluation import evaluate

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 4)
fully_shard(model)
for step in range(6):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    if rank == 0:
        print(evaluate(model, torch.randn(4, 8)))
'''
EVALUATION = "def evaluate(net, batch):\n    return net(batch).sum().item()\n"
BACKWARD = 13  # where the ranks met (rank 1's backward)
PARTED = ("`phalanx lint --select PX303` finds where the ranks part: train.py:15 (PX303): the "
          "forward of the "
          "FSDP model `model` in `evaluate()` (all-gathers parameters) under `if rank == 0:` "
          "at line 14: the other ranks never join it.")


@dataclass
class Failure:  # the fields of torch's ProcessFailure that Phalanx reads
    exitcode: int
    message: object = ""


@pytest.fixture
def job(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "evaluation.py").write_text(EVALUATION)
    monkeypatch.chdir(tmp_path)  # paths are said relative to it
    return tmp_path


def _torch_frame(name: str) -> Frame:
    return Frame(f"/x/torch/distributed/fsdp/{name}.py", 1, name)


def test_the_stack_file_and_its_neighbours_are_linted(job: Path):
    met = [Frame(str(job / "train.py"), BACKWARD, "<module>"), _torch_frame("all_gather")]
    assert static_citation([met]) == PARTED
    (job / "evaluation.py").write_text("def evaluate(net, batch):\n    return batch\n")
    assert static_citation([met]) == ""  # the helper runs no model: nothing to cite


def test_a_gloo_abort_names_where_they_met_and_lint_where_they_parted(job: Path):
    dump = (f"main-thread 0x1\nCurrent thread 0x1 (most recent call first):\n"
            f'  File "/x/torch/distributed/_composable/fsdp/_fsdp_collectives.py", line 9 in '
            f"foreach_all_gather\n"
            f'  File "{job / "train.py"}", line {BACKWARD} in <module>\n')
    crash_file(job, 1).write_text(dump)
    error = str(job_failed({1: Failure(-signal.SIGABRT)}, 0, reports=str(job)))
    assert f"at train.py:{BACKWARD} in <module>() — gloo aborts" in error, error
    assert f"the ranks ran different collectives. {PARTED[:-1]}." in error, error


def test_the_watchdogs_report_cites_it_when_no_stack_shows_the_condition(job: Path):
    train = str(job / "train.py")
    # rank 0 is past its evaluation, in the next step's forward: no stack shows the condition
    stacks = {0: [Frame(train, 12, "<module>"), _torch_frame("all_gather")],
              1: [Frame(train, BACKWARD, "<module>"), _torch_frame("reduce_scatter")]}
    report, cause = build_report(stacks, {}, 10, 2)
    assert cause.startswith("the ranks are in different places"), cause
    assert cause.endswith(PARTED), cause
    assert f"Most likely cause: {cause}" in report


def test_not_when_the_stacks_already_name_the_rank_condition(tmp_path: Path, monkeypatch):
    source = TRAIN.replace("print(evaluate(model, torch.randn(4, 8)))", "dist.barrier()")
    (tmp_path / "train.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    train = str(tmp_path / "train.py")
    stacks = {0: [Frame(train, 15, "<module>", "dist.barrier()"),
                  Frame("/x/torch/distributed/distributed_c10d.py", 1, "barrier")],
              1: [Frame(train, BACKWARD, "<module>"), _torch_frame("reduce_scatter")]}
    _, cause = build_report(stacks, {}, 10, 2)
    assert "reached only under `if rank == 0:`" in cause and "finds where the ranks part" not in cause
