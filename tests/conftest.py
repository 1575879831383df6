"""Shared fixtures: small synthetic text corpora and a temporary token cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from textgen import make_text  # noqa: E402

FULL = os.environ.get("PHALANX_FULL") == "1"  # every case of the long matrices (on demand)


# Under xdist (the README's test command: `-n 2 -m "not solo"`, then `-m solo` in one process)
# each file runs whole on one worker, so its module fixtures are made once; these files share
# one more resource (the host's munge daemon, a SLURM cluster, network namespaces) and run on
# one worker, one after another.
ONE_WORKER = {"test_slurm.py": "cluster", "test_slurm_multihost.py": "cluster",
              "test_multinode.py": "cluster", "test_multinode_errors.py": "cluster"}
# the longest files (seconds in one process), handed out first so that the two workers end
# together rather than one waiting for the other's last long file
SLOW_FIRST = ("test_slurm.py", "test_slurm_multihost.py", "test_multinode.py",  # ~400 s
              "test_multinode_errors.py", "test_torchft.py", "test_stop_stress.py",
              "test_fault_matrix.py", "test_train_user_model.py", "test_bad_input.py",
              "test_fault_tolerance.py", "test_resume_cli.py", "test_plan_simulate.py",
              "test_run_verb.py", "test_signals.py", "test_run_dir.py", "test_mlflow.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, the scope being the file (or ONE_WORKER's group)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(Path(path).name, path)

    return ByFile(config, log)


def pytest_collection_modifyitems(config, items):
    """A case marked `full` (a long matrix's case outside CI's sample) is skipped, with the
    reason said, unless PHALANX_FULL=1. A `solo` test (memory measured against a prediction,
    or processes raced against timers) is skipped, with the reason said, in an xdist worker:
    another test's processes beside it move the measured peak or the timing (README)."""
    in_worker = os.environ.get("PYTEST_XDIST_WORKER") is not None
    full = pytest.mark.skip(reason="a long matrix's case outside CI's sample: PHALANX_FULL=1 "
                                   "runs it")
    solo = pytest.mark.skip(reason="measures memory or races timers: run alone, `python -m "
                                   "pytest -m solo` (not under -n)")
    if in_worker:  # (every worker collects alike: the same order everywhere)
        first = {name: i for i, name in enumerate(SLOW_FIRST)}
        items.sort(key=lambda item: first.get(Path(str(item.fspath)).name, len(first)))
    for item in items:  # (markers, not keywords: a keyword is also any folder on the
        # test's path, and a checkout in /tmp/full skipped every test)
        if item.get_closest_marker("full") and not FULL:
            item.add_marker(full)
        if item.get_closest_marker("solo") and in_worker:
            item.add_marker(solo)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "code.txt"
    path.write_text(make_text(200_000))
    return path


@pytest.fixture(scope="session")
def small_corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("small") / "small.txt"
    path.write_text(make_text(2000, seed=3))
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def outside(tmp_path):
    """A file and a directory outside the run directory, which must stay as they are."""
    from links import SECRET

    root = tmp_path / "outside"
    (root / "dir").mkdir(parents=True)
    (root / "file").write_text(SECRET)
    return root
