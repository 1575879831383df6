"""The CLI documents itself (the bad-input table is tests/e2e/test_bad_input.py)."""

from __future__ import annotations

import subprocess
import sys


def phalanx(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_help_documents_every_option_with_defaults():
    top = phalanx("--help")
    assert top.returncode == 0 and "train" in top.stdout
    text = phalanx("train", "--help").stdout
    for flag in ["--out", "--nproc-per-node", "--max-steps", "--micro-batch-size", "--grad-accum",
                 "--seed", "--precision", "--eval-every", "--n-layer", "--n-head", "--n-embd",
                 "--block-size", "--dropout", "--lr", "--data", "--strategy", "--bucket-cap-mb",
                 "--gradient-as-bucket-view", "--static-graph", "--find-unused-parameters",
                 "--sync-batchnorm"]:
        assert flag in text, flag
    assert text.count("(default:") >= 30
    for option in text.split("\n  -")[1:]:  # one default per option, not two
        assert option.count("(default:") <= 1, option
    bench = phalanx("bench", "--help").stdout
    for flag, default in (("--repeats N", 5), ("--steps N", 10), ("--warmup N", 3)):
        assert flag in bench and f"default: {default})" in bench, flag


def test_a_launch_leaves_no_agent_directory_behind(tmp_path):
    """torch's agent makes a torchelastic_* log directory per launch and keeps it; Phalanx
    gives it one that is removed when the launch ends."""
    import os

    temp = tmp_path / "tmp"
    temp.mkdir()
    script = tmp_path / "ok.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    done = subprocess.run([sys.executable, "-m", "phalanx", "watch", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0" in done.stdout and "rank 1" not in done.stdout  # rank 1: its log
    logs = list(tmp_path.glob("runs/watch-*/logs/rank-1.log"))  # said at the start
    assert len(logs) == 1 and "rank 1" in logs[0].read_text()
    assert f"go to {logs[0].parent.parent.resolve()}/" in done.stderr
    assert [p.name for p in temp.iterdir()] == []


def test_verify_resume_help_lists_only_what_means_something_there():
    text = phalanx("verify-resume", "--help").stdout
    for gone in ("--resume", "--sample-tokens", "--checkpoint-every", "--keep-checkpoints",
                 "--max-restarts", "--spike-factor", "--straggler-every"):
        assert f"{gone} " not in text and f"{gone}\n" not in text, gone
    for kept in ("--max-steps", "--grad-accum", "--strategy", "--out", "--nproc-per-node"):
        assert kept in text, kept
    assert len(text.splitlines()) < len(phalanx("train", "--help").stdout.splitlines())


def test_doctor_and_watch_take_only_the_launch_flags_that_apply():
    doctor, watch = phalanx("doctor", "--help").stdout, phalanx("watch", "--help").stdout
    assert "--tee-ranks" in watch and "--tee-ranks" not in doctor
