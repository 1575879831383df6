"""The run report always renders: records it cannot use are skipped with one warning per
file, a bad `--out` is one line of user error, links inside the run directory are never
followed, and what it shows is what the run recorded (never a raw `None`, no trainer's
units on a user script's run)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli import main

GOOD = {"step": 1, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 900.0, "step_time_s": 0.5,
        "memory_mib": 100.0}
EVENT = {"step": 1, "kind": "spike", "message": "a loss spike", "time": "2024-01-01T00:00:00"}


def _run_dir(root: Path, metrics: list[str], events: list[str] | None = None) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in metrics))
    if events is not None:
        (run / "events.jsonl").write_text("".join(line + "\n" for line in events))
    return run


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


BAD_RECORDS = {  # name: (metrics lines, events lines or None, file warned about)
    "no-step": ([json.dumps(GOOD), '{"loss": 1.0}'], None, "metrics.jsonl"),
    "memory-not-a-number": ([json.dumps(GOOD), '{"step": 2, "memory_mib": "lots"}'], None,
                            "metrics.jsonl"),
    "step-time-not-a-number": ([json.dumps(GOOD), '{"step": 2, "step_time_s": [1]}'], None,
                               "metrics.jsonl"),
    "event-time-a-number": ([json.dumps(GOOD)], [json.dumps(EVENT), json.dumps(
        {**EVENT, "time": 5})], "events.jsonl"),
    "event-time-null": ([json.dumps(GOOD)], [json.dumps(EVENT), json.dumps(
        {**EVENT, "time": None})], "events.jsonl"),
    "int-beyond-float": ([json.dumps(GOOD), '{"step": 2, "loss": 1' + "0" * 400 + "}"], None,
                         "metrics.jsonl"),
    "step-beyond-float": ([json.dumps(GOOD), '{"step": 1' + "0" * 400 + ', "loss": 1.0}'],
                          None, "metrics.jsonl"),
    "step-1e30": ([json.dumps(GOOD), '{"step": 1e30, "loss": 1.0}'], None, "metrics.jsonl"),
    "deeply-nested": ([json.dumps(GOOD), _deep()], None, "metrics.jsonl"),
    "deeply-nested-event": ([json.dumps(GOOD)], [json.dumps(EVENT), _deep()], "events.jsonl"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_is_skipped_with_one_warning(tmp_path, capsys, case):
    metrics, events, warned = BAD_RECORDS[case]
    run = _run_dir(tmp_path, metrics, events)
    assert main(["report", str(run)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == f"wrote: {run / 'report.html'}"
    [line] = err.strip().splitlines()
    assert line.startswith(f"phalanx: warning: `{run / warned}`: skipped 1 record"), line
    assert "line 2" in line, line
    page = (run / "report.html").read_text()
    assert page.count("<svg") >= 4  # the good record's loss, lr, throughput, step time, memory
    if events is not None:
        assert "a loss spike" in page  # the good event is shown


def test_bad_json_files_of_the_run_are_left_out_with_a_warning(tmp_path, capsys):
    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    (run / "run_config.json").write_text(_deep())
    (run / "environment.json").write_text('{"world_size": 1' + "0" * 400 + "}")
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"`{run / 'run_config.json'}`" in err[0], err


def test_figures_beyond_what_a_chart_can_draw_still_render(tmp_path, capsys):
    run = _run_dir(tmp_path, [json.dumps(GOOD), '{"step": 2, "loss": 1e308, "lr": -1e308}',
                              '{"step": 3, "loss": -1e308, "lr": 1e308, "val_loss": NaN}'])
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().err == ""  # nothing skipped: they are numbers
    cards = _cards((run / "report.html").read_text())
    assert cards["final loss"] == "-1e+308", cards  # short, not 309 digits


def test_files_planted_as_links_in_the_run_are_not_read_through(tmp_path, capsys):
    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    (tmp_path / "secret.json").write_text('{"world_size": 64, "strategy": "leaked"}')
    (run / "environment.json").symlink_to(tmp_path / "secret.json")
    os.mkfifo(run / "events.jsonl")  # reading it would block for ever
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert "environment.json` is a symbolic link, not followed" in err[1], err
    assert "events.jsonl` is not a regular file" in err[0], err
    assert "leaked" not in (run / "report.html").read_text()


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("case", ["out-is-a-directory", "out-parent-missing", "out-in-proc",
                                  "report-html-is-a-directory"])
def test_a_bad_out_is_one_line_of_user_error_and_leaves_no_file(tmp_path, capsys, case):
    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    args, expect = {
        "out-is-a-directory": (["--out", str(tmp_path / "pages")], "is a directory"),
        "out-parent-missing": (["--out", str(tmp_path / "no" / "such" / "r.html")],
                               "does not exist"),
        "out-in-proc": (["--out", "/proc/x.html"], "cannot write"),
        "report-html-is-a-directory": ([], "is a directory"),
    }[case]
    (tmp_path / "pages").mkdir()
    if case == "report-html-is-a-directory":
        (run / "report.html").mkdir()
    before = _listing(tmp_path)
    assert main(["report", str(run), *args]) == 2
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert line.startswith("phalanx: error: ") and line.endswith("."), line
    assert expect in line and "Traceback" not in err, line
    assert _listing(tmp_path) == before  # no temporary file left anywhere


def test_out_as_a_directory_leaves_no_temporary_file_beside_it(tmp_path, capsys):
    """`--out /tmp` once wrote `/.tmp.tmp`: the temporary file went next to the directory."""
    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    target = tmp_path / "outer" / "dir"
    target.mkdir(parents=True)
    assert main(["report", str(run), "--out", str(target)]) == 2
    assert os.listdir(tmp_path / "outer") == ["dir"] and os.listdir(target) == []


def test_the_page_is_never_written_through_a_planted_link(tmp_path):
    from phalanx.report.run_report import build_report

    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    secret = tmp_path / "secret.txt"
    secret.write_text("mine")
    for name in ("report.html", ".report.html.tmp"):
        (run / name).symlink_to(secret)
    build_report(run)
    assert secret.read_text() == "mine"
    assert not (run / "report.html").is_symlink() and "<svg" in (run / "report.html").read_text()


def test_a_report_that_fails_midway_leaves_no_temporary_file(tmp_path, monkeypatch):
    from phalanx.report import run_report

    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    monkeypatch.setattr(run_report, "_body", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        run_report.build_report(run)
    assert sorted(os.listdir(run)) == ["metrics.jsonl"]


def test_checkpoints_linked_from_outside_the_run_are_not_followed(tmp_path):
    from phalanx.report.run_report import build_report

    run = _run_dir(tmp_path, [json.dumps(GOOD)])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with open(outside / "big.bin", "wb") as fh:  # 8 GiB, sparse: sizing it is the bug
        fh.truncate(8 * 2**30)
    mine = run / "checkpoints" / "step-00000001"
    mine.mkdir(parents=True)
    (mine / "part.bin").write_bytes(b"x" * 2**20)
    (mine / "linked.bin").symlink_to(outside / "big.bin")
    (mine / "linked-dir").symlink_to(outside)
    (run / "checkpoints" / "step-00000002").symlink_to(outside)
    page = build_report(run).read_text()
    rows = dict(re.findall(r"<code>(step-\d+)</code>.*?<td class=num>([^<]*)</td>", page))
    assert rows == {"step-00000001": "1.0 MiB"}, rows
    assert "8,192" not in page
    assert re.search(r"step-00000002</code>[^<]*</td><td[^>]*>[^<]*symbolic link, not followed",
                     page), page[page.find("Checkpoints"):][:600]
    assert "2 symbolic links inside, not followed" in page


def _trainer_run(root: Path) -> Path:
    from phalanx.config.sections import Config

    run = _run_dir(root, [json.dumps(GOOD), json.dumps({**GOOD, "step": 2, "val_loss": 1.5})])
    (run / "run_config.json").write_text(json.dumps(Config().to_dict()))
    (run / "environment.json").write_text(json.dumps(
        {"world_size": 2, "strategy": "ddp", "backend": "gloo", "threads_per_rank": 1,
         "hosts": "", "loss_unit": "nats/byte"}))
    return run


def _cells(page: str) -> dict[str, str]:
    return dict(re.findall(r"<tr><td><code>([^<]*)</code></td><td><code>([^<]*)</code>", page))


def _cards(page: str) -> dict[str, str]:
    return {k: v for v, k in re.findall(r"<div class=card><b>([^<]*)</b><span>([^<]*)</span>",
                                        page)}


def test_the_report_shows_what_was_used_never_none(tmp_path):
    from phalanx.report.run_report import build_report

    page = build_report(_trainer_run(tmp_path)).read_text()
    cells = _cells(page)
    assert "None" not in cells.values(), {k: v for k, v in cells.items() if v == "None"}
    assert cells["nproc_per_node"].startswith("2") and cells["strategy"].startswith("ddp")
    assert cells["threads_per_rank"].startswith("1") and cells["backend"].startswith("gloo")
    assert cells["hosts"] == "not recorded"
    cards = _cards(page)
    assert (cards["ranks"], cards["strategy"], cards["status"]) == ("2", "ddp", "not finished")
    assert "cross-entropy (nats/byte)" in page or "nats/byte" in page


USER_SCRIPT = """
import sys
from pathlib import Path
import torch
import phalanx

out = Path(sys.argv[1])
run = phalanx.init(seed=0, log_dir=out)
with run:
    model = torch.nn.Linear(4, 2)
    for step in (1, 2, 3):
        run.log(step, loss=3.0 / step, accuracy=0.1 * step, tokens=64)
    run.save(out / "checkpoints", 3, model)
    run.end_log()
"""


def test_a_user_scripts_run_is_reported_as_recorded(tmp_path):
    """A run directory written through the library API (`phalanx.init(log_dir=...)`,
    `run.log`, `run.save`), not by `phalanx train`."""
    from phalanx.report.run_report import build_report

    script, run = tmp_path / "mine.py", tmp_path / "mine"
    script.write_text(USER_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(run)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    page = build_report(run).read_text()
    assert "nats/byte" not in page and "cross-entropy" not in page
    cards = _cards(page)
    assert cards["status"] != "not finished" and cards["ranks"] == "1", cards
    assert "–" not in (cards["ranks"], cards["status"])
    assert not re.search(r">None<", page) and "no slow rank" not in page  # trainer's claims
    # issue 40.13: what phalanx.init knows and what run.log can measure is in the report
    assert cards["strategy"] == "single", cards
    figures = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["memory_mib"] > 0 for r in figures), figures
    assert "step_time_s" not in figures[0] and figures[1]["step_time_s"] > 0, figures
    assert figures[1]["tokens_per_s"] == 64 / figures[1]["step_time_s"], figures
    for card in ("median tokens/s", "median step time", "peak memory, rank 0"):
        assert cards[card] != "–", (card, cards)
    cells = _cells(page)
    assert (cells["world_size"], cells["backend"]) == ("1", "gloo"), cells


def test_the_report_train_writes_at_the_end_survives_bad_records(tmp_path):
    """`phalanx train`'s finish calls plot_losses and build_report after the model is
    written: a bad record in events.jsonl or metrics.jsonl must not fail the run."""
    from phalanx.report.plots import plot_losses
    from phalanx.report.run_report import build_report

    run = _trainer_run(tmp_path)
    (run / "model.safetensors").write_bytes(b"")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"loss": 1.0}\n{"step": 3, "loss": "x"}\n')
    (run / "events.jsonl").write_text(json.dumps(EVENT) + "\n" + json.dumps(
        {**EVENT, "time": None}) + "\n" + json.dumps({**EVENT, "time": 7}) + "\n")
    said: list[str] = []
    assert plot_losses(run / "metrics.jsonl", run / "loss.png", "nats/token").is_file()
    page = build_report(run, warn=said.append).read_text()
    assert "a loss spike" in page and _cards(page)["status"] == "complete"
    assert len(said) == 2, said
    assert "skipped 2 records" in said[0] and "lines 3, 4" in said[0], said
    assert "skipped 2 records" in said[1] and "lines 2, 3" in said[1], said


def test_a_refused_start_leaves_a_finished_run_as_it_was(tmp_path):
    """Issue 40.6: `phalanx run ... --strategy fsd` (refused in one line, exit 2) on a
    finished run directory rewrote its report as "failed". An attempt that ends with a
    usage error before it logged a metric or committed a checkpoint takes back its events
    and its ranks' log lines and leaves the report alone; one that advanced is a failure."""
    from phalanx.errors import UserError
    from phalanx.paths import RunDir
    from phalanx.report.account import recorded

    run = RunDir(_run_dir(tmp_path, [json.dumps(GOOD)]))
    with recorded(run, "started s.py on 2 rank(s)"):
        run.logs.mkdir()
        (run.logs / "rank-0.log").write_text("=== rank 0, attempt 0 ===\nstep 1\n")
        run.environment.write_text('{"world_size": 2, "strategy": "ddp"}')  # phalanx.init's
    files = [run.events, run.report, run.logs / "rank-0.log", run.environment]
    before = {p: p.read_bytes() for p in files}
    assert ">complete<" in run.report.read_text()

    def refused(advance: bool) -> None:
        with pytest.raises(UserError), recorded(run, "started s.py --strategy fsd"):
            with open(run.logs / "rank-0.log", "a") as log:
                log.write("=== rank 0, attempt 0 ===\nunknown strategy `fsd`\n")
            (run.logs / "rank-1.log").write_text("=== rank 1 ===\n")
            run.environment.write_text('{"world_size": 1, "strategy": "single"}')
            if advance:
                with open(run.metrics, "a") as fh:
                    fh.write(json.dumps({**GOOD, "step": 2}) + "\n")
            raise UserError("[rank 0] unknown strategy `fsd`")

    refused(advance=False)
    assert {p: p.read_bytes() for p in files} == before, "the refused start touched OUT"
    assert not (run.logs / "rank-1.log").exists()
    refused(advance=True)  # it logged step 2 first: an attempt of the run, which failed
    assert [e["kind"] for e in map(json.loads, run.events.read_text().splitlines())] == \
        ["start", "end", "start", "failure"]
    assert ">failed<" in run.report.read_text()


def test_an_attempt_killed_without_a_word_is_recorded_at_the_next_start(tmp_path):
    """Issue 40.13: a `phalanx run` launcher SIGKILLed (or its machine lost) records no
    end; the next start says so — a failure event at the step the run had reached, at
    the time the attempt last wrote — instead of a second `start` alone."""
    from phalanx.paths import RunDir
    from phalanx.report.account import recorded
    from phalanx.report.events import record_event

    run = RunDir(_run_dir(tmp_path, [json.dumps(GOOD), json.dumps({**GOOD, "step": 7})]))
    record_event(run, "start", 0, "started s.py on 2 rank(s)")
    os.utime(run.metrics, (1_700_000_000, 1_700_000_000))  # its last write: the metrics
    os.utime(run.events, (1_600_000_000, 1_600_000_000))
    with recorded(run, "started s.py on 2 rank(s)"):
        pass
    said = [json.loads(line) for line in run.events.read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in said] == \
        [("start", 0), ("failure", 7), ("start", 0), ("end", 7)], said
    assert "ended without a record" in said[1]["message"], said[1]
    assert said[1]["time"].startswith("2023-11-1"), said[1]  # 1_700_000_000 s: 2023-11-14
    with recorded(run, "started s.py on 2 rank(s)"):  # a run that ended: nothing to add
        pass
    assert [e["kind"] for e in map(json.loads, run.events.read_text().splitlines())][4:] == \
        ["start", "end"]
