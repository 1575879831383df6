"""`phalanx train --model pkg.module:factory` end to end, as a user runs it: a package of
their own in the current directory (`mylm/model.py`, a causal convolution LM: not MiniGPT),
the `phalanx` command, 2 gloo ranks under ddp and fsdp. Resume is exact across a
process restart; the export is the user's own state dict; a bad factory is one line,
exit 2, and no run directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

TESTS = Path(__file__).parents[1]
ARGS = ["--block-size", "16", "--micro-batch-size", "4", "--warmup-steps", "1",
        "--lr-decay-steps", "4", "--eval-every", "2", "--eval-batches", "1", "--log-every", "1",
        "--sample-tokens", "8"]


def phalanx() -> list[str]:
    """The installed `phalanx` command (its own directory first on sys.path, not the
    current one: what a user runs), else `python -m phalanx`."""
    script = Path(sys.executable).parent / "phalanx"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "phalanx"]


@pytest.fixture(scope="module")
def work(tmp_path_factory, small_corpus_file):
    """The user's folder: their package and their text."""
    root = tmp_path_factory.mktemp("user")
    (root / "mylm").mkdir()
    (root / "mylm" / "__init__.py").write_text("")
    shutil.copy(TESTS / "user_lm.py", root / "mylm" / "model.py")
    shutil.copy(small_corpus_file, root / "text.txt")
    return root


def train(work: Path, out: str, *extra: str, model: str = "mylm.model:conv_lm",
          ranks: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run([*phalanx(), "train", "--model", model, *ARGS, "--data", "text.txt",
                           "--cache-dir", "cache", "--out", out, "--nproc-per-node", str(ranks),
                           *extra], cwd=work, capture_output=True, text=True, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def runs(work) -> dict[str, str]:
    """Per strategy: 4 steps straight, and 2 steps then a resume (a new process) to 4;
    each run's stdout and stderr."""
    said = {}
    for strategy in ("ddp", "fsdp"):
        s = ["--strategy", strategy]
        first = train(work, f"{strategy}-straight", "--max-steps", "4", *s)
        said[f"{strategy}-straight"] = ok(first) + first.stderr
        said[f"{strategy}-half"] = ok(train(work, f"{strategy}-halves", "--max-steps", "2", *s))
        said[f"{strategy}-resumed"] = ok(train(work, f"{strategy}-halves", "--max-steps", "4",
                                               *s))
    return said


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_users_model_resumes_exactly(work, runs, strategy):
    assert "model:   yours (mylm.model:conv_lm), block 16" in runs[f"{strategy}-straight"]
    if strategy == "fsdp":  # the user's ModuleList is what FSDP shards
        assert "sharding 2 blocks `layers.0`…`layers.1` (CausalConvBlock)" in \
            runs["fsdp-straight"]
    assert "resumed from" in runs[f"{strategy}-resumed"]
    assert "at step 2" in runs[f"{strategy}-resumed"]
    a = load_file(str(work / f"{strategy}-straight" / "model.safetensors"))
    b = load_file(str(work / f"{strategy}-halves" / "model.safetensors"))
    assert sorted(a) == sorted(b) and "layers.0.conv.weight" in a  # the user's own names
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]

    def losses(run: str) -> dict:
        lines = (work / run / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: (r.get("loss"), r.get("val_loss")) for r in map(json.loads, lines)}

    assert losses(f"{strategy}-straight") == losses(f"{strategy}-halves")


def test_the_export_is_the_users_state_dict_and_names_the_factory(work, runs):
    out = work / "fsdp-halves"  # trained sharded, resumed, and written by rank 0
    config = json.loads((out / "config.json").read_text())
    assert config["factory"] == "mylm.model:conv_lm" and config["class"] == "mylm.model.ConvLM"
    assert config["factory_kwargs"] == {"vocab_size": 256, "block_size": 16}
    assert config["phalanx"]["model"]["factory"] == "mylm.model:conv_lm"
    weights = load_file(str(out / "model.safetensors"))
    sys.path.insert(0, str(work))
    try:
        from mylm.model import conv_lm

        model = conv_lm(**config["factory_kwargs"])
        model.load_state_dict(weights)  # strict: what the docs tell users to do
    finally:
        sys.path.remove(str(work))
    assert (out / "sample.txt").is_file()
    proc = subprocess.run([*phalanx(), "export", "fsdp-halves", "--out",
                           "again/model.safetensors", "--model", "mylm.model:conv_lm"],
                          cwd=work, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "`--model mylm.model:conv_lm`" in proc.stdout
    again = load_file(str(work / "again" / "model.safetensors"))
    assert sorted(again) == sorted(weights)
    assert all(torch.equal(again[k], weights[k]) for k in weights)
    assert json.loads((work / "again" / "config.json").read_text())["factory"] == config["factory"]


def test_resuming_with_another_model_is_refused(work, runs):
    proc = train(work, "ddp-halves", "--max-steps", "6", model="mylm.model:hf_style")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--model mylm.model:conv_lm → mylm.model:hf_style" in lines[0]


def test_verify_resume_under_zero_with_a_model_that_returns_its_own_loss(work):
    """`forward(idx, targets)` → (logits, loss), the optimizer sharded (ZeRO-1): N straight
    and N/2 + resume bitwise equal, as `phalanx verify-resume` checks on every rank."""
    proc = subprocess.run([*phalanx(), "verify-resume", "--model", "mylm.model:with_targets",
                           "--strategy", "zero", *ARGS, "--data", "text.txt", "--cache-dir",
                           "cache", "--out", "vr", "--nproc-per-node", "2", "--max-steps", "4"],
                          cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PASS: resume is exact" in proc.stdout


@pytest.mark.parametrize("spec, needle", [
    ("mylm.model:raises", "the factory raised ValueError: no weights here"),
    ("nowhere.model:f", "cannot load it (ModuleNotFoundError: No module named 'nowhere')"),
    ("mylm.model:wrong_vocab", "its forward returned logits of shape (1, 16, 257); "
                               "expected (B, T, 256)"),
    ("mylm.model:returns_int", "returned int; expected a torch.nn.Module"),
])
def test_a_bad_factory_is_one_line_and_leaves_nothing(work, spec, needle):
    out = f"bad-{spec.rpartition(':')[2]}"
    proc = train(work, out, "--max-steps", "2", model=spec)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"phalanx: error: `--model {spec}`"), lines
    assert needle in lines[0], lines[0]
    assert not (work / out).exists()


def test_a_thread_the_factory_leaves_running_ends_with_the_job(work):
    """Issue 39: a factory that starts a thread that never ends (not a daemon) hung the
    launcher and every rank at interpreter exit, after "done"."""
    proc = subprocess.run([*phalanx(), "train", "--model", "mylm.model:with_thread", *ARGS,
                           "--data", "text.txt", "--cache-dir", "cache", "--out", "thread",
                           "--nproc-per-node", "2", "--max-steps", "1"],
                          cwd=work, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "users-own-thread" in line]
    assert len(said) == 1 and "still run" in said[0], proc.stderr[-3000:]  # the launcher's
    for rank in (0, 1):  # and each rank's, in its log
        assert "ending the process although thread(s) `users-own-thread`" in \
            (work / "thread" / "logs" / f"rank-{rank}.log").read_text()


def test_init_from_a_save_pretrained_directory_under_fsdp(work, tmp_path):
    """`--init-from DIR`: the run starts from the directory's weights (a step at lr 1e-30
    moves no fp32 weight: the exported model equals the files bit for bit), and a resumed
    run continues from its checkpoint instead."""
    pytest.importorskip("transformers", reason="transformers is not installed (the `test` "
                        "extra has it)")
    from safetensors.torch import load_file

    from user_lm import tiny_llama

    torch.manual_seed(5)
    tiny_llama(256, 16).save_pretrained(work / "hf")
    args = ("--init-from", "hf", "--strategy", "fsdp", "--tokenizer", "bytes", "--optimizer",
            "adamw", "--lr", "1e-30", "--min-lr", "0", "--max-steps", "1")
    said = ok(train(work, str(tmp_path / "run"), *args, model="mylm.model:tiny_llama"))
    assert "started from the weights of hf" in said
    files = load_file(str(work / "hf" / "model.safetensors"))
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert sorted(weights) == sorted(files)
    assert all(torch.equal(weights[k], v) for k, v in files.items())
    again = ok(train(work, str(tmp_path / "run"), *args[:-1], "2",
                     model="mylm.model:tiny_llama"))
    assert "started from" not in again and "resumed from" in again
