"""`phalanx slurm` renders every value it is given so that it stays one value: a value
that a `#SBATCH` line cannot carry is refused in one line (exit 2, nothing written); any
other reaches sbatch as that directive's value and `phalanx train` as one argument, and
never runs as a command.

The script is read here as SLURM reads it (`directives`: sbatch's `#SBATCH` tokenizer —
quotes, backslash escapes, `#` comments — up to the first command line), and run with
`bash` and a fake `srun` that records the argv it was given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx import cli

PWNED = "touch PWNED"


def directives(script: str) -> list[str]:
    """The arguments sbatch takes from the script's `#SBATCH` lines (src/sbatch/opt.c:
    it stops at the first line that is not a comment; in a line, whitespace separates,
    quotes group, a backslash escapes, an unquoted `#` starts a comment)."""
    found: list[str] = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        if not line.startswith("#SBATCH"):
            continue
        found += _arguments(line[len("#SBATCH"):])
    return found


def _arguments(text: str) -> list[str]:
    args, word, quote, escape, started = [], "", "", False, False
    for ch in text + " ":  # the space ends the last word
        if escape:
            word, escape = word + ch, False
        elif ch == "\\":
            escape = started = True
        elif quote:
            quote, word = ("", word) if ch == quote else (quote, word + ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            args += [word] if started else []
            word, started = "", False
        else:
            word, started = word + ch, True
    return args + [word] if started else args


def test_the_directive_reader_reads_as_sbatch_does():
    assert _arguments(' --output="/a b/\\"x\\"#y" # comment') == ['--output=/a b/"x"#y']
    assert _arguments(" --job-name=demo") == ["--job-name=demo"]


def render(tmp_path: Path, capsys, *argv: str) -> str:
    code = cli.main(["slurm", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def refused(tmp_path: Path, capsys, *argv: str) -> str:
    """The one-line error of a refused command line; nothing was written."""
    before = sorted(tmp_path.rglob("*"))
    code = cli.main(["slurm", *argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("phalanx: error: `--"), captured.err
    assert sorted(tmp_path.rglob("*")) == before
    return captured.err


@pytest.mark.parametrize("flag,value", [
    ("--job-name", f"demo\n{PWNED}"), ("--job-name", f"demo\r{PWNED}"),
    ("--job-name", f"x;{PWNED}"), ("--job-name", "two words"), ("--job-name", ""),
    ("--job-name", "-x"), ("--job-name", "n" * 129), ("--job-name", "demo#x"),
    ("--partition", f"gpu\n{PWNED}"), ("--partition", "gpu debug"), ("--partition", "gpu,"),
    ("--partition", "gpu\x1b[2J"), ("--partition", ""),
    ("--time", f"01:00:00\n{PWNED}"), ("--time", "01:00:00\n"), ("--time", "5\n"),
    ("--out", f"RUN/r\n{PWNED}"), ("--out", "RUN/r\x00x"), ("--out", "RUN/a\\b"),
    ("--out", "RUN/packjob1"), ("--out", "RUN/r\t1"),
])
def test_a_value_a_sbatch_line_cannot_carry_is_refused_in_one_line(tmp_path, capsys, flag,
                                                                   value):
    value = value.replace("RUN", str(tmp_path))
    args = [f"{flag}={value}", *([] if flag == "--out" else ["--out", str(tmp_path / "r")])]
    said = refused(tmp_path, capsys, *args)
    assert flag in said and "\n" not in said.rstrip("\n")


def test_a_hostile_out_in_the_config_file_is_refused_too(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'[train]\nout = "{tmp_path}/r\\n{PWNED}"\n')
    assert "--out" in refused(tmp_path, capsys, "--config", str(config))


HOSTILE_ARGS = [f"$({PWNED})", f"`{PWNED}`", f"'; {PWNED}; '", f"x\n{PWNED}\n", "a b\"c\\d",
                f"; {PWNED} #", "%j %% \\"]


def fake_tools(tmp_path: Path) -> dict:
    """PATH with an `srun` that records its argv (NUL-separated) and a `scontrol`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$SRUN_ARGV"\nexit 0\n')
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SRUN_ARGV": str(tmp_path / "argv")}


def test_hostile_values_stay_values_in_the_directives_and_the_command(tmp_path, capsys):
    """Every value that reaches the script, hostile but representable: sbatch reads each
    directive whole, bash parses the script, and srun gets each train argument as one
    word — nothing runs."""
    out = tmp_path / f"a b#c 'q\" $({PWNED}) `{PWNED}` 50%"
    config = tmp_path / f"c;{PWNED}.toml"
    config.write_text("[train]\nmax_steps = 3\n")
    train = ["--config", str(config), "--data", HOSTILE_ARGS[0], "--cache-dir",
             HOSTILE_ARGS[1], "--rdzv-id", HOSTILE_ARGS[2], "--resume", "auto",
             "--data", HOSTILE_ARGS[3], "--cache-dir", HOSTILE_ARGS[4],
             "--rdzv-id", HOSTILE_ARGS[5], "--data", HOSTILE_ARGS[6]]
    out.mkdir()  # as it is on the cluster: `phalanx slurm` renders, it creates no OUT
    script = render(tmp_path, capsys, *train, "--out", str(out), "--job-name", "gpt-run_2.a+b",
                    "--partition", "gpu,gpu-long", "--time", "1-00:00:00", "--nodes", "2",
                    "--gpus-per-node", "4", "--cpus-per-task", "6", "--signal-s", "120",
                    "--script", str(out / "phalanx.sbatch"))
    assert directives(script) == [
        "--job-name=gpt-run_2.a+b", "--nodes=2", "--ntasks-per-node=4", "--cpus-per-task=6",
        "--time=1-00:00:00", "--gpus-per-node=4", "--partition=gpu,gpu-long",
        "--signal=USR1@120", "--requeue", "--open-mode=append",
        f"--output={str(out).replace('%', '%%')}/slurm-%j.out", f"--chdir={Path.cwd()}"]
    assert script == (out / "phalanx.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(out / "phalanx.sbatch")]).returncode == 0
    env = fake_tools(tmp_path)
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run(["bash", str(out / "phalanx.sbatch")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
    assert argv == [sys.executable, "-m", "phalanx", "train", *train, "--out", str(out)]
    assert not list(tmp_path.rglob("PWNED")) and not list(Path.cwd().glob("PWNED"))


def test_the_note_follows_the_whole_script_in_a_shared_stream(tmp_path):
    """stdout and stderr into one pipe (`2>&1 | less`), stdout block-buffered: the script,
    then the note on a line of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-m", "phalanx", "slurm", "--out",
                           str(tmp_path / "r"), "--script", str(tmp_path / "job.sbatch")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("#!/bin/bash\n"), done.stdout[:200]
    assert done.stdout.endswith(f'exit "$code"\n# written to {tmp_path}/job.sbatch; submit '
                                f"on the cluster with: mkdir -p {tmp_path}/r && sbatch "
                                f"{tmp_path}/job.sbatch\n")


def test_rendering_creates_none_of_the_clusters_paths_here(tmp_path, capsys, monkeypatch):
    """`phalanx slurm --out /shared/run1` (render only) prints the script and writes
    nothing; with `--script FILE` it writes FILE and nothing else — OUT is the cluster's
    path, made there before sbatch (SLURM opens OUT/slurm-%j.out before the job starts)."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    out = tmp_path / "shared" / "run1"
    printed = render(tmp_path, capsys, "--out", str(out), "--nodes", "2")
    assert sorted(tmp_path.rglob("*")) == [here], "rendering created files here"
    written = render(tmp_path, capsys, "--out", str(out), "--nodes", "2", "--script",
                     "job.sbatch")
    assert sorted(tmp_path.rglob("*")) == [here, here / "job.sbatch"]
    assert written == printed == (here / "job.sbatch").read_text()
    assert f"--chdir={here}" in directives(printed)  # relative paths: read from here
    assert cli.main(["slurm", "--out", str(out), "--script", str(tmp_path / "no" / "x")]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1 and "No such file" in said.err, said
    assert sorted(tmp_path.rglob("*")) == [here, here / "job.sbatch"]


@pytest.mark.parametrize("argv,cpus", [
    (["--gpus-per-node", "8"], "4"),  # never the cluster's 1 CPU per task
    (["--gpus-per-node", "8", "--threads-per-rank", "6"], "6"),
    (["--gpus-per-node", "8", "--threads-per-rank", "6", "--cpus-per-task", "10"], "10"),
    (["--ntasks-per-node", "2"], "4"),
])
def test_cpus_per_task_follows_the_threads_per_rank_or_its_default(
        tmp_path, capsys, argv, cpus):
    script = render(tmp_path, capsys, *argv, "--out", str(tmp_path / "r"))
    asked = [d.split("=")[1] for d in directives(script) if d.startswith("--cpus-per-task")]
    assert asked == [cpus]
