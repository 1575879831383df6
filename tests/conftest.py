"""Shared fixtures: small synthetic text corpora and a temporary token cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from textgen import make_text  # noqa: E402


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
