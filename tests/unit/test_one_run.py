"""A run directory holds one run, whichever `--fault-tolerance` wrote it (issue 39, item
8): a torchft run's groups (`OUT/replica-G`) and a run without torchft are never left
side by side — refused under `--resume auto`, moved to `OUT/superseded/` on a fresh
start, in one line."""

from __future__ import annotations

import json

import pytest

from phalanx.checkpoint.rundir import one_run, reconcile
from phalanx.errors import UserError
from phalanx.ft.publish import publish


def _torchft_run(out):
    for g in (0, 1):
        (out / f"replica-{g}" / "checkpoints" / "step-00000010").mkdir(parents=True)


def test_a_fresh_start_moves_a_torchft_runs_groups_aside(tmp_path):
    out, said = tmp_path / "run", []
    _torchft_run(out)
    (out / "metrics.jsonl").write_text('{"step": 3}\n')
    target = reconcile(out, None, said.append)
    assert target is not None and sorted(p.name for p in target.iterdir()) == [
        "metrics.jsonl", "replica-0", "replica-1"]
    assert (target / "replica-1" / "checkpoints" / "step-00000010").is_dir()
    assert sorted(p.name for p in out.iterdir()) == ["superseded"]
    assert said == [f"moved the previous run in this directory (this run starts fresh): 0 "
                    f"checkpoint(s) and 1 result file(s) and 2 torchft replica group run(s) "
                    f"to {target} — nothing was deleted."]


@pytest.mark.parametrize("torchft", [False, True])
def test_the_other_modes_run_is_refused_under_resume_auto(tmp_path, torchft):
    out = tmp_path / "run"
    if torchft:  # a run without torchft in OUT
        (out / "checkpoints" / "step-00000010").mkdir(parents=True)
    else:
        _torchft_run(out)
    with pytest.raises(UserError, match="a run directory holds one run") as refused:
        one_run(out, torchft, "auto")
    assert ("(`checkpoints`)" if torchft else "(`replica-0`, `replica-1`)") in str(refused.value)
    one_run(out, torchft, "never")  # a fresh start: reconcile moves it
    one_run(out, not torchft, "auto")  # its own mode continues it


def test_a_checkpoint_inside_what_a_start_would_move_is_refused_not_moved(tmp_path):
    """`--resume OUT/replica-0/checkpoints/step-N` (a torchft group's checkpoint) in a run
    without torchft: the start would move the groups aside, its own checkpoint with them,
    and then fail to find it — refused in one line, nothing moved."""
    out, said = tmp_path / "run", []
    _torchft_run(out)
    chosen = out / "replica-0" / "checkpoints" / "step-00000010"
    with pytest.raises(UserError) as info:
        reconcile(out, chosen, said.append)
    assert "\n" not in str(info.value) and said == []
    assert f"`--resume {chosen}` lies in `{out / 'replica-0'}`" in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["replica-0", "replica-1"]


def _finished(out, group="1"):
    """A torchft run whose group GROUP finished: its outputs in OUT/replica-GROUP."""
    _torchft_run(out)
    done = out / f"replica-{group}"
    for name, text in (("model.safetensors", "weights"), ("config.json", "{}"),
                       ("metrics.jsonl", '{"step": 10}\n'), ("report.html", "<html>"),
                       ("ft-steps.jsonl", "{}\n")):
        (done / name).write_text(f"{name} of {group}: {text}")


def test_a_finished_torchft_run_has_its_result_at_the_top_of_out(tmp_path, outside):
    """Issue 45: the result was only in OUT/replica-G; any script written for a plain run
    looks for OUT/model.safetensors. The group's details stay where they are."""
    out = tmp_path / "run"
    _finished(out)
    (out / "sample.txt").write_text("an earlier run's sample")  # not this run's: removed
    (outside / "kept").write_text("outside")
    (out / "config.json").symlink_to(outside / "kept")  # a planted link: replaced
    copied = publish(out, "1")
    assert copied == ["model.safetensors", "config.json", "metrics.jsonl", "report.html"]
    assert (out / "model.safetensors").read_text() == "model.safetensors of 1: weights"
    assert not (out / "config.json").is_symlink() and (outside / "kept").read_text() == "outside"
    assert not (out / "sample.txt").exists() and not (out / "ft-steps.jsonl").exists()
    assert json.loads((out / "ft-result.json").read_text())["group"] == "1"
    one_run(out, True, "auto")  # the published result is the torchft run's own
    with pytest.raises(UserError, match=r"holds a `--fault-tolerance torchft` run"):
        one_run(out, False, "auto")
    said: list[str] = []
    target = reconcile(out, None, said.append)  # a fresh start moves it all, marker too
    assert target is not None and sorted(p.name for p in out.iterdir()) == [
        "report.html", "superseded"]  # (the page is rewritten by any run, as a plain run's)
    assert "4 result file(s) and 2 torchft replica group run(s)" in said[0]
    assert (target / "ft-result.json").is_file()


def test_results_at_the_top_without_a_published_marker_are_another_runs(tmp_path):
    out = tmp_path / "run"
    _finished(out)
    (out / "model.safetensors").write_text("a plain run's")
    with pytest.raises(UserError, match=r"\(`model.safetensors`\)"):
        one_run(out, True, "auto")
