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
    assert f"at train.py:{BACKWARD} in <module>() — gloo aborted: a peer's message did not " \
           f"fit the collective, so the ranks ran this FSDP collective with " \
           f"different sizes or dtypes, or ran different collectives" in error, error
    assert f"across the ranks). {PARTED[:-1]}." in error, error


GLOO = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  "
        "[enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. "
        "{} vs {}. Received data size doesn't match expected size.\n")


def test_a_gloo_abort_says_what_its_size_check_found_in_the_ranks_log(job: Path):
    """gloo's check (bytes sent into a smaller receive) read from the end of the aborting
    rank's log: the same call with different sizes or dtypes is said, not only "different
    collectives" (a log that is a link is not read)."""
    dump = (f"main-thread 0x1\nCurrent thread 0x1 (most recent call first):\n"
            f'  File "/x/torch/distributed/distributed_c10d.py", line 9 in all_reduce\n'
            f'  File "{job / "train.py"}", line 11 in <module>\n')
    crash_file(job, 0).write_text(dump)
    logs = job / "logs"
    logs.mkdir()
    (logs / "rank-0.log").write_text("x" * 20000 + GLOO.format(8, 4))
    error = str(job_failed({0: Failure(-signal.SIGABRT)}, 0, reports=str(job), logs=str(logs)))
    assert ("in all_reduce at train.py:11 in <module>() — gloo aborted: a peer sent 8 bytes "
            "where 4 were expected, so the ranks ran this all_reduce with different sizes or "
            "dtypes, or ran different collectives") in error, error
    (logs / "rank-0.log").unlink()
    (job / "elsewhere.log").write_text(GLOO.format(16, 4))
    (logs / "rank-0.log").symlink_to(job / "elsewhere.log")
    error = str(job_failed({0: Failure(-signal.SIGABRT)}, 0, reports=str(job), logs=str(logs)))
    assert "16 bytes" not in error and "a peer's message did not fit" in error, error


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
