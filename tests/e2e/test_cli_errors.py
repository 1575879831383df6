"""Bad input: one clear message on stderr, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


def phalanx(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.txt").write_text("")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (d / "short.txt").write_text("print('hello')\n" * 20)
    (d / "broken.toml").write_text("[model\nn_layer = 2\n")
    (d / "unknown.toml").write_text("[train]\nmax_step = 3\n")
    (d / "a_file").write_text("x")
    return d


CASES = {
    "nproc": (["--nproc-per-node", "0"], "`--nproc-per-node` must be a positive number"),
    "micro-batch": (["--micro-batch-size", "0"], "`--micro-batch-size` must be a positive number"),
    "heads": (["--n-embd", "100", "--n-head", "3"], "must be divisible by `--n-head` (3)"),
    "precision": (["--precision", "fp8"], "invalid choice: 'fp8'"),
    "block-size": (["--data", "{d}/short.txt", "--block-size", "4096"],
                   "`--block-size` 4096 is longer than the corpus allows"),
    "missing-data": (["--data", "{d}/nope.txt"], "`--data` path `{d}/nope.txt` does not exist"),
    "empty-data": (["--data", "{d}/empty.txt"], "its files are empty"),
    "binary-data": (["--data", "{d}/binary.bin"], "its files are binary"),
    "unwritable-out": (["--out", "{d}/a_file/run"], "is not a writable directory"),
    "malformed-toml": (["--config", "{d}/broken.toml"], "is not valid TOML"),
    "unknown-key": (["--config", "{d}/unknown.toml"], "unknown key `max_step` in `[train]`"),
    "single-many": (["--strategy", "single", "--nproc-per-node", "2"], "would train 2 unrelated"),
    "keep-zero": (["--keep-checkpoints", "0"], "`--keep-checkpoints` must be at least 1, got 0"),
    "lr-decay": (["--lr-decay-steps", "-1"], "`--lr-decay-steps` must be >= 0"),
    "sync-bn-on-cpu": (["--sync-batchnorm", "--nproc-per-node", "2"], "`--sync-batchnorm` needs CUDA"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_message(case, files, tmp_path):
    args, needle = CASES[case]
    args = [a.format(d=files) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "run")]
    proc = phalanx("train", *args, "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 2, proc.stderr
    assert needle.format(d=files) in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, lines  # argparse: usage + error; ours: the error alone


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
