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


def test_a_usage_error_stays_one_when_the_agent_stopped_its_rank():
    """Rank 0 recorded a full disk (a UserError) and the agent stopped it before it could
    exit with 2, because rank 1 lost the connection at the same moment (seen once in a
    full run of tests/e2e/test_resume_cli.py): still the usage error, exit 2."""
    from phalanx.errors import UserError
    from phalanx.launch.failures import job_failed

    full = "StorageFull: No space left on device writing into `run`. Free space."
    lost = "DistributedError: [rank 1] Connection closed by peer [127.0.0.1]:1234"
    error = job_failed({0: Failure(-signal.SIGTERM, {"message": full}),
                        1: Failure(1, {"message": lost})}, max_restarts=0)
    assert isinstance(error, UserError), error
    assert str(error).startswith("[rank 0] No space left on device"), error
    crash = job_failed({0: Failure(-signal.SIGTERM, {"message": "RuntimeError: boom"}),
                        1: Failure(1, {"message": lost})}, max_restarts=0)
    assert not isinstance(crash, UserError), crash


def test_a_phalanx_error_is_said_in_its_own_words_and_the_rank_once():
    """A rank's DistributedError (a replica group without a lighthouse) is not shown as
    `DistributedError: [rank 0] ...` after `rank 0 exited with code 1`; a user's or
    torch's error keeps its class name, which says what it is."""
    from phalanx.launch.failures import job_failed

    quorum = ("DistributedError: [rank 0] replica group 1: no quorum from the lighthouse "
              "at http://h:1 within 3 s")
    error = job_failed({0: Failure(1, {"message": quorum})}, max_restarts=0)
    assert str(error) == ("[rank 0] the job failed: rank 0 exited with code 1: replica group "
                          "1: no quorum from the lighthouse at http://h:1 within 3 s.")
    theirs = job_failed({0: Failure(1, {"message": "ValueError: bad"})}, max_restarts=0)
    assert str(theirs) == "[rank 0] the job failed: rank 0 exited with code 1: ValueError: bad."


def test_a_users_error_says_the_line_that_raised_it(tmp_path, monkeypatch):
    """The recorded traceback's innermost user frame, and the rank condition above it."""
    from phalanx.launch.failures import job_failed

    monkeypatch.chdir(tmp_path)  # (paths are said relative to it)
    script = tmp_path / "train.py"
    script.write_text("import torch\nrank = 1\nif rank == 1:\n    raise ValueError('bad')\n")
    stack = (f'Traceback (most recent call last):\n  File "{script}", line 4, in <module>\n'
             f"    raise ValueError('bad')\nValueError: bad\n")
    error = job_failed({1: Failure(1, {"message": "ValueError: bad",
                                       "extraInfo": {"py_callstack": stack}})}, max_restarts=0)
    assert str(error) == ("[rank 1] the job failed: rank 1 exited with code 1: ValueError: bad "
                          "(raised at train.py:4 in <module>(), under `if rank == 1:` at "
                          "train.py:3).")


def test_the_line_raised_at_is_the_scripts_in_the_last_traceback(tmp_path, monkeypatch):
    """Not the standard library's frame under it, nor a frame of an earlier exception in
    the chain."""
    import json

    from phalanx.launch.failures import job_failed

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("import json\ntry:\n    x = 1\nexcept KeyError:\n    json.loads('{')\n")
    stack = (f'Traceback (most recent call last):\n  File "{script}", line 3, in <module>\n'
             f"KeyError: 'a'\n\nDuring handling of the above exception, another exception "
             f'occurred:\n\nTraceback (most recent call last):\n  File "{script}", line 5, '
             f'in <module>\n    json.loads(\'{{\')\n  File "{json.__file__}", line 346, in loads\n'
             f"json.decoder.JSONDecodeError: Expecting property name\n")
    message = "json.decoder.JSONDecodeError: Expecting property name"
    error = job_failed({0: Failure(1, {"message": message,
                                       "extraInfo": {"py_callstack": stack}})}, max_restarts=0)
    assert str(error).endswith(f"{message} (raised at train.py:5 in <module>()).")
