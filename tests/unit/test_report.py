"""Rank-0 progress output."""

from __future__ import annotations


def test_progress_bar_on_a_terminal_and_lines_elsewhere(capsys):
    from phalanx.report.progress import ProgressReporter

    plain = ProgressReporter(10, live=False)
    plain.update(5, 2.5, 1000.0, 1e-3)
    assert "step 5/10 | loss 2.5000 | 1,000 tok/s | lr 1.00e-03 | eta" in capsys.readouterr().out
    live = ProgressReporter(10, live=True)
    live.update(10, 1.25, 2000.0, 1e-4)
    live.close()
    assert "loss 1.2500" in capsys.readouterr().out


def test_the_tensorboard_note_is_said_once_per_run_directory_by_one_torchft_group(
        tmp_path, monkeypatch, capsys):
    """Issue 40.14: the note came on every run (a resume in the same directory too) and
    from every torchft replica group; now once per run directory, by the first group."""
    import phalanx
    from phalanx.cluster import protocol
    from phalanx.report import sink

    monkeypatch.setattr(sink, "tensorboard_available", lambda: False)

    def notes(out, group: str | None = None) -> int:
        if group is not None:
            monkeypatch.setenv(protocol.FT_GROUP, group)
            monkeypatch.setenv(protocol.FT_LIGHTHOUSE, "http://127.0.0.1:1")
        with phalanx.init(seed=0, threads=1, out=out) as run:
            run.log(1, loss=1.0)
        return capsys.readouterr().out.count("TensorBoard is not installed")

    assert notes(tmp_path / "run") == 1  # a new run directory
    assert notes(tmp_path / "run") == 0, "said again when the run resumed in its directory"
    said = {group: notes(tmp_path / f"ft-{group}", group)
            for group in ("0", "1", "node-a-0", "node-a-1")}
    assert said == {"0": 1, "1": 0, "node-a-0": 1, "node-a-1": 0}, said
