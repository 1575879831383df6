"""`phalanx slurm … run SCRIPT [ARGS...]` and `phalanx k8s … run SCRIPT [ARGS...]` (issue
27): the job runs the user's script under `phalanx run` instead of `phalanx train` — the
same directives, requeue on 138 and pod shape; every word after SCRIPT reaches the script
as one argument. A missing script, a trainer flag given with `run`, or anything but `run`
after the flags is one line and exit 2, with nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_k8s import against_the_operators_api
from test_slurm_script_safety import HOSTILE_ARGS, PWNED, directives

from phalanx import cli
from phalanx.cli.cluster_job import Job, run_parser
from phalanx.errors import UserError

ARGS = ["--lr", "3e-4", "--out", "theirs", "--nodes", "9", "--max-steps", "5", "--", "-x"]


def slurm(capsys, *argv: str) -> str:
    code = cli.main(["slurm", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def k8s(capsys, *argv: str) -> tuple[dict, str]:
    """The manifest read as kubectl reads it (YAML), and what went to stderr."""
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifest back")
    code = cli.main(["k8s", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return yaml.safe_load(captured.out), captured.err


def srun_line(script: str) -> str:
    [line] = [x for x in script.splitlines() if x.startswith("srun ")]
    return line


def fake_tools(tmp_path: Path, srun_exit: int) -> dict:
    """PATH with an `srun` that records its argv (NUL-separated) and exits `srun_exit`,
    and an `scontrol` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        f'#!/bin/sh\nprintf "%s\\0" "$@" > "$SRUN_ARGV"\nexit {srun_exit}\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$@" > "$SCONTROL_ARGV"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
            "SRUN_ARGV": str(tmp_path / "argv"), "SCONTROL_ARGV": str(tmp_path / "scontrol")}


def test_slurm_run_renders_srun_phalanx_run_with_the_trainers_directives(tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    cluster = ["--nodes", "2", "--gpus-per-node", "4", "--time", "02:00:00",
               "--partition", "gpu", "--job-name", "mine", "--signal-s", "120"]
    script = slurm(capsys, *cluster, "--out", str(tmp_path / "r"), "--script", "r.sbatch",
                   "--tee-ranks", "--hang-timeout-s", "60", "--nproc-per-node", "4", "run",
                   "train.py", *ARGS)
    trainer = slurm(capsys, *cluster, "--out", str(tmp_path / "t"))
    assert directives(script) == [d.replace(f"{tmp_path}/t/", f"{tmp_path}/r/")
                                  for d in directives(trainer)]
    assert srun_line(script) == "srun " + " ".join(
        [sys.executable, "-m", "phalanx", "run", "--tee-ranks", "--hang-timeout-s", "60",
         "--out", str(tmp_path / "r"), str(tmp_path / "train.py"), *ARGS])
    assert script == (tmp_path / "r.sbatch").read_text()
    # the requeue block is the trainer's, word for word but its comment
    tail = lambda text: [x for x in text.split("code=$?")[1].splitlines()  # noqa: E731
                         if not x.lstrip().startswith("#")]
    assert tail(script) == tail(trainer)
    assert "scontrol requeue \"$SLURM_JOB_ID\"" in script and "run.save" in script


@pytest.mark.parametrize("srun_exit,requeued", [(0, False), (138, True), (1, False)])
def test_the_script_job_requeues_on_138_only_and_passes_every_argument_whole(
        tmp_path, capsys, srun_exit, requeued):
    """Hostile script name and arguments: bash parses the script and srun gets each of
    them as one word — nothing runs; exit 138 (a stop under `phalanx run`) requeues."""
    user = tmp_path / f"my script $({PWNED}) `{PWNED}`;'q\".py"
    user.write_text("print('hi')\n")
    out = tmp_path / f"a b#c 'q\" $({PWNED}) 50%"
    slurm(capsys, "--out", str(out), "--script", str(tmp_path / "job.sbatch"),
          "--debug-collectives", "run", str(user), *HOSTILE_ARGS)
    env = fake_tools(tmp_path, srun_exit)
    work = tmp_path / "cwd"
    work.mkdir()
    done = subprocess.run(["bash", str(tmp_path / "job.sbatch")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == srun_exit, done.stderr
    argv = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
    assert argv == [sys.executable, "-m", "phalanx", "run", "--debug-collectives", "--out",
                    str(out), str(user), *HOSTILE_ARGS]
    said = (tmp_path / "scontrol").read_text() if (tmp_path / "scontrol").exists() else ""
    assert said == ("requeue 77\n" if requeued else "")
    assert not list(tmp_path.rglob("PWNED")) and not list(Path.cwd().glob("PWNED"))


def test_k8s_run_runs_phalanx_run_on_every_pod_and_is_a_valid_pytorchjob(capsys):
    """The script is a path inside the container: not looked for here."""
    cluster = ["--nodes", "3", "--image", "reg/phalanx:1", "--nproc-per-node", "2",
               "--volume-claim", "runs", "--out", "/phalanx/run1"]
    job, err = k8s(capsys, *cluster, "--rdzv-id", "j7", "run", "/phalanx/code/train.py", *ARGS)
    trainer, _ = k8s(capsys, *cluster)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 2}
    for role, spec in specs.items():
        [container] = spec["template"]["spec"]["containers"]
        assert container["command"] == ["python", "-m", "phalanx", "run", "--out",
                                        "/phalanx/run1", "--rdzv-id", "j7",
                                        "/phalanx/code/train.py", *ARGS]
        [theirs] = trainer["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"][
            "containers"]
        assert {k: v for k, v in container.items() if k != "command"} == \
            {k: v for k, v in theirs.items() if k != "command"}
    assert job["spec"]["nprocPerNode"] == "2" and err == ""
    against_the_operators_api(job)


def test_k8s_notes_that_a_relative_script_is_read_in_the_container(capsys, tmp_path,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)  # no train.py here: that is not an error
    job, err = k8s(capsys, "--image", "img:1", "run", "train.py")
    [container] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
        "containers"]
    assert container["command"] == ["python", "-m", "phalanx", "run", "train.py"]
    assert err.count("\n") == 1 and "read inside the container" in err


def refused(tmp_path: Path, capsys, argv: list[str]) -> str:
    """The one-line error; nothing printed or written."""
    before = sorted(tmp_path.rglob("*"))
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("phalanx: error: "), captured.err
    assert sorted(tmp_path.rglob("*")) == before
    return captured.err


@pytest.mark.parametrize("verb", ["slurm", "k8s"])
@pytest.mark.parametrize("words,said", [
    (["run"], "`run` needs the script the job runs"),
    (["run", ""], "`run` needs the script the job runs"),
    (["run", "--tee-ranks", "train.py"], "`phalanx run`'s flags go before `run`"),
    (["train.py"], "unexpected `train.py`: after its flags"),
    (["--", "train.py"], "unexpected `train.py`: after its flags"),
])
def test_a_missing_or_misplaced_script_is_one_line(tmp_path, capsys, monkeypatch, verb,
                                                   words, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    own = ["--out", str(tmp_path / "r")] if verb == "slurm" else ["--image", "img:1"]
    err = refused(tmp_path, capsys, [verb, *own, *words])
    assert said in err and f"`phalanx {verb} [flags] run SCRIPT [ARGS...]`" in err


@pytest.mark.parametrize("verb", ["slurm", "k8s"])
def test_trainer_flags_with_run_are_named_in_one_line(tmp_path, capsys, monkeypatch, verb):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "c.toml").write_text("[train]\nmax_steps = 3\n")
    own = ["--out", str(tmp_path / "r")] if verb == "slurm" else ["--image", "img:1"]
    trainer = ["--preset", "small", "--max-steps=5", "--no-compile", "--config", "c.toml",
               "--no-debug-collectives", "--preset", "tiny"]
    err = refused(tmp_path, capsys, [verb, *own, *trainer, "--tee-ranks", "--threads-per-rank",
                                     "2", "run", "train.py", "--preset", "x"])
    assert err.startswith("phalanx: error: `--preset`, `--max-steps`, `--no-compile`, "
                          "`--config`, `--no-debug-collectives`: the trainer's, "
                          "not `phalanx run`'s"), err
    assert "--tee-ranks`" not in err and f"`phalanx {verb}` flags" in err


def test_every_flag_phalanx_run_takes_passes_through(tmp_path, capsys):
    """Read back by `phalanx run`'s own parser; --threads-per-rank also sizes the tasks."""
    user = tmp_path / "train.py"
    user.write_text("")
    run_flags = ["--threads-per-rank", "3", "--max-restarts", "2", "--strategy", "fsdp",
                 "--hang-timeout-s", "0",
                 "--debug-collectives", "--no-tee-ranks", "--rdzv-timeout-s", "30",
                 "--nccl-preset", "infiniband", "--rdzv-id", "j1"]
    script = slurm(capsys, "--out", str(tmp_path / "r"), *run_flags, "run", str(user), "a")
    assert "--cpus-per-task=3" in directives(script)
    assert srun_line(script) == "srun " + " ".join(
        [sys.executable, "-m", "phalanx", "run", *run_flags, "--out", str(tmp_path / "r"),
         str(user), "a"])
    ns = run_parser().parse_args([*run_flags, str(user), "a"])
    assert (ns.script, ns.args, ns.hang_timeout_s, ns.debug_collectives) == \
        (str(user), ["a"], 0.0, True)


def test_what_phalanx_run_would_refuse_is_refused_when_rendering():
    with pytest.raises(UserError, match="`phalanx run` would refuse the job's command line: "
                                        "unrecognized arguments: --max-steps"):
        Job(["--max-steps", "3"], "train.py").command("python", {}, [])


def test_slurm_needs_the_script_here(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = refused(tmp_path, capsys, ["slurm", "--out", str(tmp_path / "r"), "run", "nope.py"])
    assert "the script (`run SCRIPT`) `nope.py` does not exist" in err
    (tmp_path / "adir").mkdir()
    err = refused(tmp_path, capsys, ["slurm", "--out", str(tmp_path / "r"), "run", "adir"])
    assert "`adir` is a directory, not a regular file" in err


def test_the_trainer_path_still_refuses_a_stray_word_in_one_line(tmp_path, capsys):
    err = refused(tmp_path, capsys, ["slurm", "--out", str(tmp_path / "r"), "oops"])
    assert "unexpected `oops`" in err
