"""Nothing Phalanx writes follows a link it did not make (tier 1: no process group).

A run directory holding a link is refused when it is locked, naming the link and where
it points; each write, move and delete also replaces, unlinks or refuses a link met at
that moment, so one planted after the check is never followed either.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from links import SECRET
from phalanx.checkpoint.rundir import LOCK, RunDirLock, reconcile
from phalanx.errors import UserError
from phalanx.paths import atomic_write, check_run_dir, run_dir_links


def untouched(outside: Path) -> bool:
    return (outside / "file").read_text() == SECRET and not any((outside / "dir").iterdir())


def test_atomic_write_replaces_a_link_at_the_name_or_at_its_temporary(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.html").symlink_to(outside / "file")
    (run / ".environment.json.tmp").symlink_to(outside / "file")
    atomic_write(run / "report.html", "<html>")
    atomic_write(run / "environment.json", "{}")
    assert untouched(outside)
    assert not (run / "report.html").is_symlink() and (run / "report.html").read_text() == "<html>"
    assert (run / "environment.json").read_text() == "{}"
    assert sorted(p.name for p in run.iterdir()) == ["environment.json", "report.html"]


def test_a_failed_rename_leaves_no_temporary(tmp_path):
    (tmp_path / "taken").mkdir()  # a directory at the name: os.replace refuses it
    with pytest.raises(OSError):
        atomic_write(tmp_path / "taken", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_links_are_found_where_phalanx_writes_and_out_itself_may_be_one(tmp_path, outside):
    real = tmp_path / "scratch"
    (real / "checkpoints" / "step-00000005").mkdir(parents=True)
    (real / "logs").mkdir()
    out = tmp_path / "run"
    out.symlink_to(real, target_is_directory=True)  # the user's own choice: allowed
    check_run_dir(out)
    RunDirLock(out).acquire().release()
    (real / "environment.json").symlink_to(outside / "file")
    (real / "logs" / "rank-0.log").symlink_to(outside / "file")
    (real / "checkpoints" / "latest").symlink_to(outside / "file")
    (real / "checkpoints" / "step-00000005" / "manifest.json").symlink_to(outside / "file")
    assert [str(p.relative_to(out)) for p in run_dir_links(out)] == [
        "checkpoints/latest", "checkpoints/step-00000005/manifest.json", "environment.json",
        "logs/rank-0.log"]


def test_a_run_directory_holding_a_link_is_refused_when_locked(tmp_path, outside):
    out = tmp_path / "run"
    out.mkdir()
    (out / "environment.json").symlink_to(outside / "file")
    with pytest.raises(UserError) as info:
        RunDirLock(out).acquire()
    message = str(info.value)
    assert "\n" not in message
    assert f"`{out / 'environment.json'}` is a link (→ `{outside / 'file'}`)" in message
    assert "Remove the link or choose another `--out`." in message
    assert not (out / LOCK).exists()  # refused before anything was written


def test_a_lock_file_planted_as_a_link_is_not_written_through(tmp_path, outside, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).symlink_to(outside / "file")
    # planted after the directory was checked: opening it still does not follow it
    monkeypatch.setattr("phalanx.checkpoint.rundir.check_run_dir", lambda out: None,
                        raising=False)
    with pytest.raises(UserError, match="is a link"):
        RunDirLock(out).acquire().record_holder()
    assert untouched(outside)


def _checkpoint(root: Path, step: int) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"created": float(step)}))
    return path


def test_a_checkpoint_that_is_a_link_is_this_runs_own(tmp_path):
    out = tmp_path / "run"
    root = out / "checkpoints"
    _checkpoint(root, 5)
    moved = _checkpoint(tmp_path / "elsewhere", 10)
    (root / moved.name).symlink_to(moved, target_is_directory=True)
    said: list[str] = []
    assert reconcile(out, root / moved.name, said.append) is None  # nothing to move
    assert said == [] and not (out / "superseded").exists()
    assert sorted(p.name for p in root.iterdir()) == ["step-00000005", "step-00000010"]


def test_a_checkpoints_link_never_moves_the_outside_directorys_steps(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    other = tmp_path / "other-run" / "checkpoints"
    _checkpoint(other, 7)
    (out / "checkpoints").symlink_to(other, target_is_directory=True)
    with pytest.raises(UserError, match="is a link"):
        reconcile(out, None, print)
    assert [p.name for p in other.iterdir()] == ["step-00000007"]
    assert not (out / "superseded").exists()


def test_the_latest_marker_is_not_written_through_a_planted_temporary(tmp_path, outside):
    from phalanx.checkpoint.saver import commit

    root = tmp_path / "checkpoints"
    tmp = root / ".tmp-step-00000005"
    tmp.mkdir(parents=True)
    (tmp / "train_state.json").write_text("{}")
    (root / ".latest.tmp").symlink_to(outside / "file")
    commit(tmp, root / "step-00000005", {"created": 1.0}, keep=2)
    assert untouched(outside)
    assert (root / "latest").read_text() == "step-00000005"
    assert not (root / "latest").is_symlink()


def test_a_planted_temporary_checkpoint_directory_is_unlinked_not_written_into(
        tmp_path, outside):
    from phalanx.checkpoint.saver import _Job

    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / ".tmp-step-00000005").symlink_to(outside / "dir", target_is_directory=True)
    job = _Job(root, 5, {}, 2, "")
    job.begin()
    assert job.error is None
    assert job.tmp.is_dir() and not job.tmp.is_symlink()
    (job.tmp / "__0_0.distcp").write_text("tensors")  # what DCP writes goes inside
    assert untouched(outside)


def test_the_current_temporary_directory_is_emptied_not_removed(tmp_path):
    """Another rank's DCP may have made `.tmp-step-N` before rank 0's `begin`: removing it
    under that rank's `mkdir(exist_ok=True)` failed it with "File exists" (CI, 3 ranks).
    An ended process's files in it are removed; the directory itself stays."""
    from phalanx.checkpoint.saver import _Job

    root = tmp_path / "checkpoints"
    (root / ".tmp-step-00000005").mkdir(parents=True)
    (root / ".tmp-step-00000005" / "__1_0.distcp").write_text("an ended process's")
    (root / ".tmp-step-00000003").mkdir()  # another step's: removed
    held = os.open(root / ".tmp-step-00000005", os.O_RDONLY | os.O_DIRECTORY)
    try:
        job = _Job(root, 5, {}, 2, "")
        job.begin()
        assert os.fstat(held).st_nlink > 0  # (a removed directory has no link left)
    finally:
        os.close(held)
    assert job.error is None
    assert list(job.tmp.iterdir()) == [] and not (root / ".tmp-step-00000003").exists()


def test_export_writes_config_json_beside_the_weights_never_through_a_link(
        tmp_path, outside):
    from phalanx.checkpoint.export import export_weights
    from phalanx.models import GPTConfig, MiniGPT

    out = tmp_path / "w"
    out.mkdir()
    (out / "config.json").symlink_to(outside / "file")
    (out / "model.safetensors").symlink_to(outside / "dir" / "model.safetensors")
    model = MiniGPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8))
    export_weights(model, out)
    assert untouched(outside)
    assert json.loads((out / "config.json").read_text())["n_embd"] == 16
    assert not (out / "model.safetensors").is_symlink()
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == oct(
        0o666 & ~_umask())
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_export_force_refuses_a_config_json_link(tmp_path, outside):
    from phalanx.cli.export import _target

    out = tmp_path / "w"
    out.mkdir()
    (out / "config.json").symlink_to(outside / "file")
    with pytest.raises(UserError) as info:
        _target(str(out / "model.safetensors"), force=True)
    assert f"`{out / 'config.json'}` is a link (→ `{outside / 'file'}`)" in str(info.value)
    assert "never writes through a link" in str(info.value)


def test_a_link_named_with_a_line_break_is_still_one_line(tmp_path, outside):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl\nphalanx: done").symlink_to(f"{outside}/file\nforged")
    with pytest.raises(UserError) as info:
        check_run_dir(out)
    assert "\n" not in str(info.value) and "metrics.jsonl\\nphalanx: done" in str(info.value)


def test_a_lock_file_made_for_a_refused_start_is_removed(tmp_path):
    """A start refused in a directory that already existed, before writing anything,
    leaves nothing behind (issue 39: `OUT/.phalanx.lock` was left); a lock file that was
    there before, or beside the run's files, stays (another holder may have it open)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="refused"), RunDirLock(empty):
        raise UserError("refused")
    assert list(empty.iterdir()) == []
    RunDirLock(empty).acquire().release()
    assert list(empty.iterdir()) == []
    ran = tmp_path / "ran"
    ran.mkdir()
    with RunDirLock(ran):
        (ran / "metrics.jsonl").write_text("{}\n")
    assert sorted(p.name for p in ran.iterdir()) == [LOCK, "metrics.jsonl"]
    (ran / "metrics.jsonl").unlink()
    with RunDirLock(ran):  # the lock file was there before: not this start's to remove
        pass
    assert [p.name for p in ran.iterdir()] == [LOCK]

