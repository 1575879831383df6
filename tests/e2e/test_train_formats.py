"""`phalanx train` on every `--data` format and `--tokenizer` option, through the real
CLI on a small input (text + bytes: tests/e2e/test_train_cli.py); and the refusals —
exit 2, one line, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from phalanx import cli
from phalanx.data.tokenizer import load_tokenizer_file, train_bpe

SMALL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
         "--micro-batch-size", "4", "--max-steps", "4", "--eval-every", "4", "--log-every", "2",
         "--eval-batches", "2", "--sample-tokens", "12", "--nproc-per-node", "1"]
DOCS = [f"def item_{i}(x):\n    return x * {i} + {i % 7}  # café {i}" for i in range(400)]


def train(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "train", *SMALL, *args],
                          capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess, out) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert "val_loss" in records[-1]
    assert (out / "sample.txt").read_text(encoding="utf-8")
    return config


def test_jsonl_with_a_bpe_trained_here_on_two_ranks(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS))
    out, cache = tmp_path / "run", tmp_path / "cache"
    proc = train("--data", str(data), "--text-field", "body", "--tokenizer", "bpe:300",
                 "--cache-dir", str(cache), "--out", str(out), "--nproc-per-node", "2")
    config = _ok(proc, out)
    assert proc.stdout.count("training a 300-id BPE") == 1  # once, by the launcher
    (folder,) = cache.iterdir()
    tok = load_tokenizer_file(folder / "tokenizer.json")
    assert config["vocab_size"] == tok.vocab_size == 300
    sample = (out / "sample.txt").read_text(encoding="utf-8")
    assert sample.startswith("def item_") or sample.startswith("    return x")  # decoded text
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    per_byte, per_token = records[-1]["val_nats_per_byte"], records[-1]["val_loss"]
    assert per_byte < per_token  # a token is several bytes
    assert f"nats/token = {per_byte:.4f} nats/byte" in proc.stdout  # the done line
    assert config["tokenizer"].startswith("bpe 300")
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    exported = tmp_path / "exported"  # `phalanx export` of a checkpoint takes it along
    done = subprocess.run([sys.executable, "-m", "phalanx", "export", str(out), "--out",
                           str(exported / "model.safetensors")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (exported / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()


def test_a_saved_dataset_with_a_users_tokenizer_and_parquet_with_bpe(tmp_path):
    datasets = pytest.importorskip("datasets")
    tok = train_bpe(DOCS, 280)
    tok.tok.save(str(tmp_path / "tokenizer.json"))
    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "saved"))
    datasets.Dataset.from_dict({"text": DOCS}).to_parquet(str(tmp_path / "d.parquet"))
    for data, spec in (("saved", str(tmp_path / "tokenizer.json")), ("d.parquet", "bpe")):
        out = tmp_path / f"run-{data}"
        proc = train("--data", str(tmp_path / data), "--tokenizer", spec, "--cache-dir",
                     str(tmp_path / "c"), "--out", str(out))
        assert _ok(proc, out)["vocab_size"] < 4096  # BPE: few merges exist in so little text
    caches = {json.loads((f / "meta.json").read_text())["tokenizer_kind"]: f
              for f in (tmp_path / "c").iterdir()}
    assert sorted(caches) == ["bpe", "file"]
    mine = (caches["file"] / "tokenizer.json").read_bytes()
    assert mine == (tmp_path / "tokenizer.json").read_bytes()  # the user's file, as it is
    used = load_tokenizer_file(caches["bpe"] / "tokenizer.json")
    assert 256 < used.vocab_size <= 4096


def test_pre_tokenized_bins_with_their_tokenizer(tmp_path):
    tok = train_bpe(DOCS, 300)
    tok.tok.save(str(tmp_path / "tokenizer.json"))
    ids = np.asarray([i for d in DOCS for i in tok.encode(d + "\n")], dtype=np.uint32)
    (tmp_path / "bins").mkdir()
    ids[: len(ids) * 9 // 10].tofile(tmp_path / "bins" / "train.bin")
    ids[len(ids) * 9 // 10:].tofile(tmp_path / "bins" / "val.bin")
    out = tmp_path / "run"
    proc = train("--data", str(tmp_path / "bins"), "--bin-dtype", "uint32", "--tokenizer",
                 str(tmp_path / "tokenizer.json"), "--cache-dir", str(tmp_path / "c"),
                 "--out", str(out))
    config = _ok(proc, out)
    assert config["vocab_size"] == tok.vocab_size
    assert "token ids" not in (out / "sample.txt").read_text()  # decoded with the file
    kept = sorted(p.name[:5] for p in (tmp_path / "c").iterdir())
    assert kept == ["bins-", "bins-"]  # used in place: only each file's dtype scan remembered


def _refused(capfd, argv: list[str], needle: str, out, cache) -> None:
    code = cli.main(["train", *SMALL, *argv, "--out", str(out), "--cache-dir", str(cache)])
    stdout, stderr = capfd.readouterr()
    assert code == 2, stdout + stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], stderr
    assert "Traceback" not in stderr + stdout
    assert not out.exists()  # no run directory left
    assert not cache.exists() or not list(cache.iterdir())  # no cache, no temporary files


def test_bad_inputs_are_one_line_and_write_nothing(tmp_path, capfd):
    out, cache = tmp_path / "run", tmp_path / "cache"
    (tmp_path / "t.txt").write_text("\n".join(DOCS))
    (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
    _refused(capfd, ["--data", str(tmp_path / "t.txt"), "--tokenizer", str(tmp_path / "bad.json")],
             "is JSON but not a tokenizer", out, cache)
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n{"content": "b", "id": 1}\n')
    _refused(capfd, ["--data", str(tmp_path / "d.jsonl"), "--tokenizer", "bpe:300"],
             "d.jsonl` line 2 has no field `text` (its fields: `content`, `id`)", out, cache)
    (tmp_path / "bins").mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(1, 3000, dtype=np.uint32).tofile(tmp_path / "bins" / name)
    _refused(capfd, ["--data", str(tmp_path / "bins")],
             "looks like uint32 ids. Pass `--bin-dtype uint32`", out, cache)
