"""One 2-rank launch (torch's elastic agent, as for users) runs every multi-rank
scenario in one process group, shared by the test modules here (~5 s of start-up)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from phalanx.launch.agent import launch_workers

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def results(tmp_path_factory, corpus_file, small_corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("ddp")
    script = str(Path(__file__).parent / "scenarios.py")
    launch_workers([script, str(out), str(corpus_file), str(small_corpus_file),
                    str(cache_dir)], 2, threads=1)
    return out
