"""The restart line names the rank that died even when torch's agent logs, as its "first"
failure, a rank it stopped itself (its failure records are timed to the second)."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

import pytest

from phalanx.launch.failures import LAST_FAILURE, RestartNotes


@dataclass
class Failure:  # the fields of torch's ProcessFailure that Phalanx reads
    exitcode: int
    message: object = ""


class Context:  # stands in for torch's process context, which logs from a method
    def __init__(self, failures: dict) -> None:
        self._failures = failures

    def poll(self, first: int) -> None:
        logging.getLogger(RestartNotes.LOGGER).error(
            "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
            self._failures[first].exitcode, first, 1234, "python")


@pytest.mark.parametrize("stopped", [-signal.SIGTERM, 128 + signal.SIGTERM])
def test_a_rank_the_agent_stopped_is_not_named_as_the_cause(stopped):
    """Killed by the agent's SIGTERM, or exited with 143 from a handler of it (the
    trainer's stop path): either way not the cause."""
    context = Context({0: Failure(stopped), 1: Failure(-signal.SIGKILL)})
    with RestartNotes(None):
        context.poll(first=0)  # the tie went to rank 0, which the agent stopped
        said = os.environ[LAST_FAILURE]
    assert said == "rank 1 was killed by SIGKILL"
    assert LAST_FAILURE not in os.environ  # the launcher's own environment is put back


def test_the_logged_record_is_used_when_no_context_is_found():
    with RestartNotes("node-b"):
        logging.getLogger(RestartNotes.LOGGER).error(
            "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", 1, 3, 99, "python")
        assert os.environ[LAST_FAILURE] == "local rank 3 on node-b exited with code 1"
