"""The checkpoint store in one process: commit, rotation, verification, safe loading."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn

import phalanx
from phalanx.checkpoint.resume import newest_valid, resolve_resume
from phalanx.checkpoint.safety import UnsafeCheckpoint
from phalanx.checkpoint.digest import entry, file_digest
from phalanx.checkpoint.store import MANIFEST, committed, verify
from phalanx.errors import UserError


@pytest.fixture(scope="module")
def run():
    with phalanx.init(seed=0, threads=1) as r:
        yield r


def trained(run, seed=0, width=8):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.LayerNorm(width), nn.Linear(width, 2))
    model, opt = run.setup(model, lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True))
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_save_then_load_is_bitwise_and_committed(run, tmp_path):
    model, opt = trained(run)
    path = run.save(tmp_path, 3, model, opt, {"cursor": 42}, config_hash="abc")
    assert path.name == "step-00000003" and verify(path) is None
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["step"] == 3 and manifest["world_size"] == 1 and manifest["config_hash"] == "abc"
    assert {".metadata", "train_state.json"} <= manifest["files"].keys()
    assert (tmp_path / "latest").read_text() == path.name
    fresh, fresh_opt = trained(run, seed=1)
    assert run.load(path, fresh, fresh_opt) == {"cursor": 42}
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key])
    assert fresh_opt.param_groups[0]["lr"] == 1e-2


def test_rotation_keeps_the_newest(run, tmp_path):
    model, opt = trained(run)
    for step in (1, 2, 3, 4):
        run.save(tmp_path, step, model, opt, keep=2)
    assert [p.name for p in committed(tmp_path)] == ["step-00000003", "step-00000004"]
    with pytest.raises(UserError, match="`--keep-checkpoints` must be at least 1"):
        run.save(tmp_path, 5, model, opt, keep=0)


def _corrupt(path, how):
    data = next(p for p in path.iterdir() if p.suffix == ".distcp")
    if how == "truncate":
        data.write_bytes(data.read_bytes()[:-10])
    elif how == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif how == "no-manifest":
        (path / MANIFEST).unlink()


def test_corrupt_checkpoints_are_skipped_with_reasons(run, tmp_path):
    model, opt = trained(run)
    for step in (1, 2, 3, 4):
        run.save(tmp_path, step, model, opt, keep=4)
    _corrupt(tmp_path / "step-00000004", "flip")
    _corrupt(tmp_path / "step-00000003", "truncate")
    _corrupt(tmp_path / "step-00000002", "no-manifest")
    warnings = []
    assert newest_valid(tmp_path, warnings.append).name == "step-00000001"
    assert len(warnings) == 3
    assert "step-00000004" in warnings[0] and "does not match its checksum" in warnings[0]
    assert "step-00000003" in warnings[1] and "manifest says" in warnings[1]
    assert "step-00000002" in warnings[2] and "no manifest" in warnings[2]
    with pytest.raises(UserError, match="cannot be used: file .* checksum"):
        resolve_resume(str(tmp_path / "step-00000004"), tmp_path, print)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create a file when unpickled


def test_pickle_payload_is_refused_without_side_effect(run, tmp_path):
    model, opt = trained(run)
    path = run.save(tmp_path, 1, model, opt)
    marker = tmp_path / "pwned"
    meta = pickle.loads((path / ".metadata").read_bytes())
    meta.storage_meta = _Payload(str(marker))  # smuggled into DCP's own metadata object
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    manifest = json.loads((path / MANIFEST).read_text())  # forge checksums too
    manifest["files"][".metadata"] = entry((path / ".metadata").stat().st_size,
                                           file_digest(path / ".metadata"))
    (path / MANIFEST).write_text(json.dumps(manifest))
    before = [t.clone() for t in model.state_dict().values()]
    with pytest.raises(UnsafeCheckpoint, match=r"references `(builtins|io)\.open`"):
        run.load(path, model, opt)
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))
    warnings = []
    assert newest_valid(tmp_path, warnings.append) is None and "refused" in warnings[0]
    assert not marker.exists()
    pickle.loads((path / ".metadata").read_bytes())  # the payload is real: a plain load runs it
    assert marker.exists()


def test_pickled_entries_are_refused(run, tmp_path):
    dcp.save({"w": torch.ones(2), "note": {"any": "object"}}, checkpoint_id=tmp_path / "c")
    with pytest.raises(UnsafeCheckpoint, match="stored as pickled objects"):
        run.load(tmp_path / "c", nn.Linear(2, 2))


def test_a_different_model_shape_is_named(run, tmp_path):
    model, opt = trained(run, width=8)
    path = run.save(tmp_path, 1, model, opt)
    other, other_opt = trained(run, width=16)
    with pytest.raises(UserError, match=r"`model.0.weight` is \(8, 4\) there, \(16, 4\) here"):
        run.load(path, other, other_opt)


def test_an_interrupted_write_never_counts(run, tmp_path):
    model, opt = trained(run)
    run.save(tmp_path, 1, model, opt)
    shutil.copytree(tmp_path / "step-00000001", tmp_path / ".tmp-step-00000002")
    (tmp_path / ".tmp-step-00000002" / MANIFEST).unlink()
    assert newest_valid(tmp_path, print).name == "step-00000001"
    run.save(tmp_path, 3, model, opt)
    assert not (tmp_path / ".tmp-step-00000002").exists()  # stale temp dirs are cleared


def test_async_save_writes_the_state_at_the_call(run, tmp_path):
    model, opt = trained(run)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    final = run.save(tmp_path, 1, model, opt, {"n": 1}, asynchronous=True)
    with torch.no_grad():  # training goes on while the write is in flight
        for p in model.parameters():
            p.add_(1.0)
    run.wait_checkpoint()
    assert verify(final) is None and (tmp_path / "latest").read_text() == final.name
    fresh, fresh_opt = trained(run, seed=3)
    assert run.load(final, fresh, fresh_opt) == {"n": 1}
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, snapshot[key]), key
    run.save(tmp_path, 2, model, opt, asynchronous=True)
    while not run.poll_checkpoint():  # rank 0 commits as soon as the write is done
        pass
    assert [p.name for p in committed(tmp_path)] == ["step-00000001", "step-00000002"]
    run.wait_checkpoint()


def test_a_model_only_checkpoint_round_trips(run, tmp_path):
    model, _ = trained(run)
    path = run.save(tmp_path, 1, model)
    fresh, _ = trained(run, seed=2)
    run.load(path, fresh)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 fresh.state_dict().values()))
    full_model, full_opt = trained(run, seed=4)
    full = run.save(tmp_path / "full", 1, full_model, full_opt)
    run.load(full, fresh)  # weights only, from a checkpoint that also holds the optimizer
    assert torch.equal(fresh.state_dict()["0.weight"], full_model.state_dict()["0.weight"])


def test_the_direct_state_path_equals_get_state_dict(run):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from phalanx.checkpoint.store import param_groups
    from phalanx.models import GPTConfig, MiniGPT
    from phalanx.strategies.state_dict import direct_state

    model, opt = run.setup(MiniGPT(GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=8)),
                           lambda p: torch.optim.AdamW(p))  # tied head: two names, one tensor
    x = torch.randint(0, 256, (2, 8))
    model(x, x)[1].backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = direct_state(run.unwrap(model), opt)
    assert list(state["model"]) == list(msd)
    same = lambda a, b: a.data_ptr() == b.data_ptr() and torch.equal(a, b)  # noqa: E731
    assert all(same(state["model"][k], msd[k]) for k in msd)
    assert list(state["optim"]) == list(osd["state"])
    assert all(same(state["optim"][k][n], v) for k in osd["state"]
               for n, v in osd["state"][k].items())
    assert param_groups(opt) == [{k: v for k, v in g.items() if k != "params"}
                                 for g in osd["param_groups"]]


def test_a_checkpoint_is_hashed_once_per_start(run, tmp_path, monkeypatch):
    """The launcher verifies in full and names the checkpoint to the workers; rank 0's
    second choice then skips the checksums, unless the manifest changed since."""
    import phalanx.checkpoint.store as store
    from phalanx.checkpoint.resume import verified_token

    model, opt = trained(run)
    path = run.save(tmp_path, 1, model, opt)
    hashed, real = [], store.file_digest
    monkeypatch.setattr(store, "file_digest",
                        lambda p, *a: hashed.append(p.name) or real(p, *a))
    assert newest_valid(tmp_path, print) == path
    assert sorted(hashed) == sorted(json.loads((path / MANIFEST).read_text())["files"])
    token = verified_token(path)  # what the launcher's job hands the workers
    hashed.clear()
    assert newest_valid(tmp_path, print, token) == path and hashed == []
    data = next(path.glob("*.distcp"))
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps(manifest))  # other bytes: not the one verified
    assert "does not match its checksum" in verify(path) and hashed
    assert newest_valid(tmp_path, lambda line: None, token) is None


def test_manifests_with_sha256_entries_still_verify(run, tmp_path):
    """Checkpoints written before XXH3-128 list SHA-256 checksums; both are checked."""
    import hashlib

    model, opt = trained(run)
    path = run.save(tmp_path, 1, model, opt)
    manifest = json.loads((path / MANIFEST).read_text())
    assert all(set(info) == {"size", "xxh3_128"} for info in manifest["files"].values())
    for name, info in manifest["files"].items():
        assert info["xxh3_128"] == file_digest(path / name)  # hashed while written
        manifest["files"][name] = {"size": info["size"], "sha256": hashlib.sha256(
            (path / name).read_bytes()).hexdigest()}
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert verify(path) is None
    manifest["files"][".metadata"]["sha256"] = "0" * 64
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert "`.metadata` does not match its checksum" in verify(path)


def test_records_are_written_without_torchs_crc_and_the_setting_is_restored(
        run, tmp_path, monkeypatch):
    from torch import serialization

    from phalanx.checkpoint import writer

    seen = []
    write = writer._DigestingFile.write
    monkeypatch.setattr(writer._DigestingFile, "write", lambda self, data: (
        str(self.name).endswith(".distcp") and seen.append(serialization.get_crc32_options()),
        write(self, data))[1])  # (.metadata is a plain pickle: no records)
    model, opt = trained(run)
    for before in (True, False):
        serialization.set_crc32_options(before)
        seen.clear()
        path = run.save(tmp_path, int(before), model, opt)
        assert seen and not any(seen)  # the whole file's checksum replaces it (verified)
        assert serialization.get_crc32_options() is before
        assert verify(path) is None
    serialization.set_crc32_options(True)
    fresh, fresh_opt = trained(run, seed=5)
    run.load(path, fresh, fresh_opt)  # torch.load reads records without a CRC-32
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 fresh.state_dict().values()))


@pytest.mark.parametrize("works", [True, False])
def test_disk_writes_start_while_a_file_is_still_being_written(run, tmp_path, monkeypatch,
                                                               works):
    from phalanx.checkpoint import writer

    calls = []
    real = writer.START_WRITEBACK
    monkeypatch.setattr(writer, "START_WRITEBACK", lambda fd, offset, n: (
        calls.append((offset, n)), works and (real is None or real(fd, offset, n)))[1])
    model, opt = trained(run, width=1024)  # ~3 MiB of weights, 9 MiB with AdamW's state
    model2 = nn.Linear(1024, 2048)  # + 8 MiB: one tensor over the threshold on its own
    path = run.save(tmp_path, 1, nn.ModuleList([model, model2]), opt)
    assert verify(path) is None  # the checksums are those of the whole files
    if works:
        ends = [offset + n for offset, n in calls]
        assert calls and calls[0][0] == 0 and all(n >= writer.WRITEBACK_EVERY for _, n in calls)
        assert all(offset == end for (offset, _), end in zip(calls[1:], ends))  # contiguous
    else:
        assert len(calls) == 1  # refused once (e.g. no such call): fsync alone from then on


def test_deferred_staging_copies_wait_for_the_release(run):
    import threading
    import time

    from phalanx.checkpoint.staging import ReusedBufferStager

    stager = ReusedBufferStager()
    stager.deferred = lambda path: path == ("later",)
    stager.release = threading.Event()
    now, later = torch.arange(4.0), torch.arange(4.0) + 10
    staged = stager.stage({"now": now, "later": later})
    time.sleep(0.05)
    assert not staged.done()  # the training thread has the interpreter to itself
    stager.release.set()
    copy = staged.result(timeout=10)
    assert torch.equal(copy["now"], now) and torch.equal(copy["later"], later)
    stager.close()


def test_dealing_a_replicated_state_is_remembered_for_the_same_shapes():
    from phalanx.strategies.state_dict import _leaves, share_of_replicated

    state = {"model": {"a": torch.zeros(8), "b": torch.zeros(4), "c": torch.zeros(2)},
             "optim": {"a": {"step": torch.tensor(1.0), "lr": 0.1}}}
    plans: dict = {}
    shares = [share_of_replicated(state, r, 2, plans) for r in (0, 1)]
    assert shares == [share_of_replicated(state, r, 2) for r in (0, 1)]  # the same dealing
    assert [sorted(p for p, _ in _leaves(s)) for s in shares] == [
        [("model", "a"), ("optim", "a", "lr")],  # non-tensors: rank 0
        [("model", "b"), ("model", "c"), ("optim", "a", "step")]]
    assert len(plans) == 1
    (key,) = plans
    plans[key] = {("model", "c"): 0}  # what is remembered is what is used ...
    assert ("model", "c") in [p for p, _ in _leaves(share_of_replicated(state, 0, 2, plans))]
    state["model"]["c"] = torch.zeros(16)  # ... until a shape changes: dealt anew
    assert sorted(p for p, _ in _leaves(share_of_replicated(state, 0, 2, plans))) == [
        ("model", "c"), ("optim", "a", "lr")]
    assert len(plans) == 1 and key not in plans
