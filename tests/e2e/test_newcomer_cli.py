"""A newcomer's rough edges, through the command line: where verbs write, what they say,
and what `--help` shows. Most run in this process through `phalanx.cli.main` (fast)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phalanx import cli
from phalanx.report import sink

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
        "--micro-batch-size", "2", "--eval-batches", "1", "--nproc-per-node", "1"]


def phalanx(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse (--help, usage errors)
        return exc.code


def test_verify_resume_leaves_out_alone_and_says_what_it_compared(
        tmp_path, monkeypatch, capsys, small_corpus_file, cache_dir):
    monkeypatch.setattr(sink, "tensorboard_available", lambda: False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = tmp_path / "myrun"
    code = phalanx(["verify-resume", *TINY, "--max-steps", "4", "--data", str(small_corpus_file),
                    "--cache-dir", str(cache_dir), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert not out.exists(), list(out.rglob("*"))  # the user's run directory: untouched
    assert list(work.iterdir()) == []  # nor the current folder
    assert not (tmp_path / "myrun-verify-resume").exists()  # passed: its scratch is gone
    lines = text.splitlines()
    notes = [i for i, line in enumerate(lines) if "TensorBoard is not installed" in line]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert len(notes) == 1 and notes[0] < first_step, text  # once, before the progress
    assert "pip install -e '" in lines[notes[0]] and "[tensorboard]'" in lines[notes[0]]
    compared = next(line for line in lines if line.startswith("compared: step 4 loss "))
    straight, resumed = compared.split(" loss ")[1].split(" resumed")[0].split(" straight, ")
    assert straight == resumed, compared
    assert lines[-1].startswith("PASS: resume is exact") and lines.index(compared) < len(lines) - 1


def test_the_tensorboard_note_names_pypi_outside_a_checkout(monkeypatch):
    class Dist:
        def read_text(self, name):
            return None  # installed from an index: no direct_url.json

    monkeypatch.setattr(sink, "tensorboard_available", lambda: False)
    monkeypatch.setattr("importlib.metadata.distribution", lambda name: Dist())
    assert "`pip install 'phalanx[tensorboard]'` adds them" in sink.tensorboard_note()


def test_the_sample_starts_from_the_users_own_text(tmp_path, monkeypatch, capsys, cache_dir):
    data = tmp_path / "notes.txt"
    data.write_text("".join(f"note {i}: the fox saw {i % 7} hens\n" for i in range(300)))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = phalanx(["train", *TINY, "--max-steps", "2", "--sample-tokens", "8", "--data",
                    str(data), "--cache-dir", str(cache_dir), "--out", str(out)])
    assert code == 0, capsys.readouterr()
    sample = (out / "sample.txt").read_text()
    assert sample.startswith("note "), sample  # not the Python corpus's `def `


def test_bench_help_lists_its_own_flags_first_and_only_what_applies(capsys):
    assert phalanx(["train", "--help"]) == 0
    train = capsys.readouterr().out
    assert phalanx(["bench", "--help"]) == 0
    bench = capsys.readouterr().out
    options = bench[bench.index("\noptions:"):]  # past the usage lines
    own = max(options.index(f) for f in ("--peers", "--repeats N", "--steps N", "--warmup N"))
    assert own < options.index("--n-layer"), options[:own + 200]
    assert len(bench.splitlines()) < 0.8 * len(train.splitlines())
    for gone in ("--eval-every", "--checkpoint-every", "--sample-tokens", "--resume"):
        assert f"  {gone}" not in bench, gone
    assert phalanx(["bench", "--eval-every", "7", "--help"]) == 0  # still accepted


@pytest.mark.parametrize("verb", list(cli.VERBS))
def test_every_verbs_help_exits_0(verb, capsys):
    assert phalanx([verb, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: phalanx {verb}")


def test_watch_writes_nothing_in_the_current_folder(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("print('hello from rank 0')\n")
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "phalanx", "watch", "--nproc-per-node", "1",
                           str(script)], capture_output=True, text=True, timeout=120, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [p.name for p in work.iterdir()] == ["runs"]  # not logs/ beside the user's files
    (run,) = (work / "runs").iterdir()
    assert run.name.startswith("watch-") and (run / "logs").is_dir()
    assert f"go to {run.resolve()}/" in done.stderr  # said where


@pytest.mark.parametrize("body, factory, code", [
    ("import sys\nsys.exit(5)\n", "f", 5),
    ("def f():\n    exit()\n", "f", 0),
    ("import sys\ndef f():\n    sys.exit(3)\n", "f", 3),
])
def test_a_model_factory_that_exits_is_one_user_error(tmp_path, monkeypatch, capsys, body,
                                                      factory, code):
    name = f"exits_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert phalanx(["plan", "--model", f"{name}:{factory}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"phalanx: error: `--model {name}:{factory}`")
    assert f"exit code {code})" in err[0], err
    assert ("importing" if "exit(5)" in body else f"calling `{factory}()`") in err[0]
    sys.modules.pop(name, None)


def test_the_sample_prompt_of_the_embedded_corpus_is_unchanged():
    from phalanx.config.sections import build_config
    from phalanx.train.finish import sample_prompt

    assert sample_prompt(build_config({}), None) == "def "
    assert sample_prompt(build_config({"data": {"path": "x.txt"}}), None) == "\n"
