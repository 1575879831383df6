"""A link planted in a run directory is never followed (`phalanx train`, `phalanx export`).

Found by an adversarial probe: `environment.json`, `.report.html.tmp` or `logs` as links
made a run write outside its directory; a `checkpoints` link made it move another
directory's checkpoints into `superseded/`; a checkpoint that was a link was taken for
"another directory", so the run's progress was moved aside and it started from step 0;
`phalanx export --force` wrote through a `config.json` link. Now such a directory is
refused in one line naming the link and where it points (exit 2), before anything is
moved or written, and export refuses the link even with `--force`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from links import SECRET
from phalanx.checkpoint.store import committed

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "5", "--eval-batches", "1",
        "--sample-tokens", "0", "--nproc-per-node", "1", "--checkpoint-every", "5",
        "--keep-checkpoints", "2"]


def phalanx(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", *argv], capture_output=True,
                          text=True, timeout=180)


def train(out: Path, corpus: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    return phalanx("train", *ARGS, "--data", str(corpus), "--cache-dir", str(cache),
                   "--out", str(out), *extra)


def refused_naming(proc: subprocess.CompletedProcess, link: Path, target: Path) -> None:
    """Exit 2, one line on stderr (no traceback) naming the link, its target and the fix."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert f"`{link}` is a link (→ `{target}`)" in lines[0], lines[0]
    assert "Remove the link or choose another `--out`" in lines[0], lines[0]




@pytest.fixture(scope="module")
def trained(tmp_path_factory, small_corpus_file, cache_dir) -> Path:
    """A run of 10 steps: checkpoints 5 and 10. Tests work on copies of it."""
    out = tmp_path_factory.mktemp("trained") / "run"
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "10")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("name, points_to, ranks", [
    ("environment.json", "file", "1"), (".report.html.tmp", "file", "1"),
    ("logs", "dir", "2")])  # rank logs are written under Phalanx's launcher (2 ranks)
def test_a_planted_link_is_refused_before_anything_is_written(
        tmp_path, outside, small_corpus_file, cache_dir, name, points_to, ranks):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).symlink_to(outside / points_to)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5", "--nproc-per-node",
                 ranks)
    assert (outside / "file").read_text() == SECRET and not any((outside / "dir").iterdir())
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing written, nothing moved
    refused_naming(proc, out / name, outside / points_to)


def test_a_checkpoints_link_never_moves_the_other_directorys_checkpoints(
        tmp_path, trained, small_corpus_file, cache_dir):
    other = tmp_path / "other"
    shutil.copytree(trained, other, symlinks=True)
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").symlink_to(other / "checkpoints", target_is_directory=True)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5", "--resume", "never")
    assert [p.name for p in committed(other / "checkpoints")] == ["step-00000005",
                                                                  "step-00000010"]
    assert not (out / "superseded").exists() and not (other / "superseded").exists()
    refused_naming(proc, out / "checkpoints", other / "checkpoints")


def test_a_linked_checkpoint_is_refused_and_the_progress_is_kept(
        tmp_path, trained, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    shutil.copytree(trained, out, symlinks=True)
    link, elsewhere = out / "checkpoints" / "step-00000010", tmp_path / "scratch" / "step-10"
    elsewhere.parent.mkdir()
    shutil.move(link, elsewhere)
    link.symlink_to(elsewhere, target_is_directory=True)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "15")
    assert not (out / "superseded").exists() and link.is_symlink()  # nothing moved aside
    assert [p.name for p in committed(out / "checkpoints")] == ["step-00000005",
                                                                "step-00000010"]
    assert "resumed from" not in proc.stdout and "moved" not in proc.stdout
    refused_naming(proc, link, elsewhere)
    # the fix the message gives: the run continues from its own step 10
    link.unlink()
    shutil.move(elsewhere, link)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "15")
    assert proc.returncode == 0, proc.stderr
    assert "step-00000010 at step 10" in proc.stdout


def test_export_force_does_not_write_through_a_config_json_link(tmp_path, trained, outside):
    target = tmp_path / "w"
    target.mkdir()
    (target / "config.json").symlink_to(outside / "file")
    proc = phalanx("export", str(trained), "--out", str(target / "model.safetensors"),
                   "--force")
    assert (outside / "file").read_text() == SECRET
    assert [p.name for p in target.iterdir()] == ["config.json"]
    refused_naming(proc, target / "config.json", outside / "file")
    assert "never writes through a link" in proc.stderr
