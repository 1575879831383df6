"""Every writer of a fixed name in a directory a run or a job writes (the run directory,
the hang report directory, `phalanx bench`'s output, `phalanx doctor`'s verdict file)
replaces or refuses a link planted at that name; none writes through it (issue 42).

Each test plants a link to a file outside and checks that file is untouched; the last
one scans src/phalanx for a write by name that is neither link-safe nor known to write
only into a private directory Phalanx made (mkdtemp) or to a path the user named.
"""

from __future__ import annotations

import ast
import json
import signal
from pathlib import Path

import pytest

from links import SECRET
from phalanx.errors import UserError


def untouched(outside: Path) -> bool:
    return (outside / "file").read_bytes() == SECRET.encode() and not any(
        (outside / "dir").iterdir())


def planted(directory: Path, name: str, outside: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / name
    link.symlink_to(outside / "file")
    return link


@pytest.mark.parametrize("append", [False, True], ids=["fresh", "resumed"])
def test_metrics_jsonl_refuses_a_link_in_one_line(tmp_path, outside, append):
    from phalanx.report.metrics import MetricsWriter

    link = planted(tmp_path / "run", "metrics.jsonl", outside)
    with pytest.raises(UserError) as info:
        MetricsWriter(link, append=append).write({"step": 1, "loss": 2.0})
    message = str(info.value)
    assert "\n" not in message
    assert f"`{link}` is a link (→ `{outside / 'file'}`)" in message
    assert "Remove the link" in message
    assert untouched(outside)


def test_metrics_jsonl_still_starts_afresh_or_appends(tmp_path):
    from phalanx.report.metrics import MetricsWriter, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 9}\n')
    for append, step in ((True, 10), (False, 1)):
        writer = MetricsWriter(path, append=append)
        writer.write({"step": step})
        writer.close()
        if append:
            assert [r["step"] for r in read_metrics(path)] == [9, 10]
    assert [r["step"] for r in read_metrics(path)] == [1]


def test_events_jsonl_refuses_a_link_in_one_line(tmp_path, outside):
    from phalanx.report.events import record_event

    link = planted(tmp_path / "run", "events.jsonl", outside)
    with pytest.raises(UserError, match="is a link") as info:
        record_event(tmp_path / "run", "restart", 3, "restarted")
    assert "\n" not in str(info.value) and untouched(outside)
    link.unlink()
    record_event(tmp_path / "run", "restart", 3, "restarted")
    assert json.loads(link.read_text())["kind"] == "restart"


def test_hang_report_replaces_a_link(tmp_path, outside, monkeypatch):
    import torch.distributed as dist

    from phalanx.hang.watchdog import REPORT_NAME, Watchdog

    run = tmp_path / "run"
    link = planted(run, REPORT_NAME, outside)
    dog = Watchdog(dist.HashStore(), 0, 1, 1.0, run)
    exits: list[str | None] = []
    monkeypatch.setattr(dog, "_collect_stacks", lambda deadline: ({0: None}, {}))
    monkeypatch.setattr(dog, "_exit", lambda report: exits.append(report))
    dog._report_and_exit({})
    assert untouched(outside)
    assert not link.is_symlink() and link.read_text().strip()
    assert exits and str(link) in exits[0]


def test_crash_record_replaces_a_link_and_is_not_read_through_one(tmp_path, outside):
    import faulthandler

    from phalanx.hang.crash import CrashRecorder, crash_file, crashed_at

    run = tmp_path / "run"
    link = planted(run, crash_file(run, 0).name, outside)
    was_enabled = faulthandler.is_enabled()
    recorder = CrashRecorder(run, 0)
    try:
        assert recorder.file is not None
        assert not link.is_symlink() and link.read_text().startswith("main-thread ")
    finally:
        recorder.close()
        if was_enabled:  # pytest's own handler, which close() turned off
            faulthandler.enable()
    assert untouched(outside) and not link.exists()
    (outside / "file").write_text("main-thread 0x1\nThread 0x1\n  File \"x.py\", line 3 in f\n")
    link.symlink_to(outside / "file")  # a dump planted as a link: not read
    assert crashed_at(str(run), 0) is None


def test_k8s_manifest_replaces_a_link_as_slurm_script_does(tmp_path, outside, capsys):
    from phalanx import cli

    link = planted(tmp_path, "job.yaml", outside)
    assert cli.main(["k8s", "--image", "reg/phalanx:1", "--manifest", str(link)]) == 0
    assert untouched(outside)
    assert not link.is_symlink() and "PyTorchJob" in link.read_text()
    assert link.read_text() in capsys.readouterr().out


def test_doctor_verdict_replaces_a_link(tmp_path, outside, monkeypatch):
    from phalanx.cluster import protocol
    from phalanx.doctor.rank_checks import _verdict

    link = planted(tmp_path, "phalanx-doctor-1.code", outside)
    monkeypatch.setenv(protocol.DOCTOR_RESULT, str(link))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    assert _verdict(True) == 0
    assert untouched(outside)
    assert not link.is_symlink() and link.read_text() == "1"


def test_bench_report_plots_and_results_replace_links(tmp_path, outside):
    from test_bench_report import RESULTS

    from phalanx.bench import markdown as report
    from phalanx.bench.parent import _partial

    out = tmp_path / "run" / "bench"
    names = ("report.md", "peers.png", "scaling.png", "results.json")
    links = [planted(out, name, outside) for name in names]
    (out / "raw.json").write_text(json.dumps({**RESULTS, "stopped": True}))
    said = _partial(out, signal.SIGINT)
    assert "partial report" in said
    assert untouched(outside)
    assert not any(link.is_symlink() for link in links)
    assert json.loads((out / "results.json").read_text())["stopped"] is True
    assert (out / "peers.png").read_bytes().startswith(b"\x89PNG")
    link = planted(tmp_path / "elsewhere", "x", outside).parent
    bench = tmp_path / "run2" / "bench"
    bench.parent.mkdir()
    bench.symlink_to(link, target_is_directory=True)
    with pytest.raises(UserError, match="is a link"):
        report.write(RESULTS, bench)
    assert untouched(outside) and sorted(p.name for p in link.iterdir()) == ["x"]


# -- the scan: every write by name in src/phalanx is link-safe or listed here, with why --

SRC = Path(__file__).resolve().parents[2] / "src" / "phalanx"
WRITES = {"write_text", "write_bytes", "savefig", "export_chrome_trace", "FileHandler",
          "save_file"}
REVIEWED = {  # (file, function): why it cannot write through a link planted by someone else
    ("data/writer.py", "join_documents"): "the cache's private mkdtemp folder (data/cache)",
    ("data/writer.py", "write_bytes"): "the cache's private mkdtemp folder",
    ("data/writer.py", "write_tokens"): "the cache's private mkdtemp folder",
    ("data/corpus.py", "_build"): "the cache's private mkdtemp folder",
    ("plan/compare.py", "measure_locally"): "a private TemporaryDirectory",
    ("plan/measure.py", "worker"): "its result path is in measure_locally's private folder",
    ("checkpoint/export.py", "_save_plain"): "export's private mkdtemp folder",
    ("checkpoint/export.py", "write_weights"): "into paths.replacing's private folder",
    ("bench/runner.py", "breakdown"): "into paths.replacing's private folder",
    ("runtime/profiling.py", "write"): "a private TemporaryDirectory (then atomic_write)",
    ("report/plots.py", "_plot"): "into an io.BytesIO (then paths.atomic_write)",
    ("cluster/startup_trace.py", "mark"): "PHALANX_STARTUP_TRACE: a file the user names",
}


def _opens_to_write(call: ast.Call) -> bool:
    """`open(name, mode)` or `Path.open(mode)` with a mode that writes — every string a
    mode expression could take counts (`"a" if append else "w"`); one that is no string
    at all is taken as writing. `os.open` (flags, not a mode) is not a call to open."""
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open":
        position = 1
    elif isinstance(f, ast.Attribute) and f.attr == "open" and not (
            isinstance(f.value, ast.Name) and f.value.id in ("os", "Image")):
        position = 0
    else:
        return False
    given = call.args[position:position + 1] or [k.value for k in call.keywords
                                                if k.arg == "mode"]
    if not given:
        return False
    modes = [n.value for n in ast.walk(given[0])
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return not modes or any(set(m) & set("wax+") for m in modes)


def writes_by_name(tree: ast.AST) -> list[tuple[str, int]]:
    """(enclosing function, line) of each call that opens a file by name to write it."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            elif isinstance(child, ast.Call):
                f = child.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                is_savefig_to_buffer = called == "savefig" and isinstance(
                    child.args[0], ast.Name) and child.args[0].id == "buf"
                if (called in WRITES and not is_savefig_to_buffer) or _opens_to_write(child):
                    found.append((function, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return found


def test_every_write_by_name_is_link_safe_or_reviewed():
    unsafe = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("lint/"):
            continue
        for function, line in writes_by_name(ast.parse(path.read_text())):
            if (rel, function) not in REVIEWED:
                unsafe.append(f"{rel}:{line} ({function})")
    assert not unsafe, ("writes by name that follow a link planted at the name (use "
                        "paths.atomic_write, paths.replacing or paths.open_append): "
                        + ", ".join(unsafe))


def test_the_scan_finds_a_plain_write():
    tree = ast.parse("def f(p, a):\n    open(p, 'w').write('x')\n    p.write_text('y')\n"
                     "    open(p).read()\n    fig.savefig(buf)\n    fig.savefig(p)\n"
                     "    open(p, 'a' if a else 'w')\n    p.open('ab')\n    p.open()\n"
                     "    os.open(p, os.O_RDONLY)\n    open(p, mode=m)\n")
    assert writes_by_name(tree) == [("f", 2), ("f", 3), ("f", 6), ("f", 7), ("f", 8),
                                    ("f", 11)]
