"""Shared fixtures: small synthetic text corpora and a temporary token cache."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from textgen import make_text  # noqa: E402

FULL = os.environ.get("PHALANX_FULL") == "1"  # every case of the long matrices (on demand)


def pytest_collection_modifyitems(config, items):
    """A case marked `full` (a long matrix's case outside CI's sample) is skipped, with the
    reason said, unless PHALANX_FULL=1."""
    if FULL:
        return
    skip = pytest.mark.skip(reason="a long matrix's case outside CI's sample: PHALANX_FULL=1 "
                                   "runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


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
