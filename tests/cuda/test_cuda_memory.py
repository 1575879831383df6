"""Memory and checkpoints on a GPU: `phalanx plan --measure`'s peak against the CUDA
allocator's own, and an async checkpoint's training stall with pinned staging memory."""

from __future__ import annotations

import pytest
from cuda_helpers import scenario

pytestmark = pytest.mark.cuda

MEASURE_BAND = (0.9, 1.1)  # plan --measure's peak / torch.cuda.max_memory_allocated
GiB = 2**30


def test_plan_measure_agrees_with_the_cuda_allocator(tmp_path, figure):
    got = scenario("measured", tmp_path, steps=3, micro_batch_size=8)
    ratio = got["peak"] / got["cuda_max_allocated"]
    low, high = MEASURE_BAND
    assert low <= ratio <= high, (f"plan --measure says {got['peak'] / GiB:.2f} GiB, the "
                                  f"allocator's peak is {got['cuda_max_allocated'] / GiB:.2f} "
                                  f"GiB (ratio {ratio:.3f})")
    figure("plan --measure vs allocator, gpt2-124m bf16 muon mb 8", ratio=ratio,
           measured_gib=got["peak"] / GiB, allocator_gib=got["cuda_max_allocated"] / GiB,
           step_s=got["step_s"])


def test_an_async_checkpoint_stalls_less_with_pinned_staging(tmp_path, figure):
    got = scenario("checkpoint_stall", tmp_path, root=str(tmp_path / "ckpt"))
    assert got["staging_buffers"] > 0 and got["all_pinned"], \
        "the async save's staging buffers are not in pinned host memory"
    assert got["async_stall_s"] < got["sync_stall_s"] / 2, got
    assert got["overlap_stall_s"] < got["sync_stall_s"] / 2, got
    figure("checkpoint stall, gpt2-124m + AdamW", state_gib=got["bytes"] / GiB,
           sync_s=got["sync_stall_s"], async_s=got["async_stall_s"],
           overlap_s=got["overlap_stall_s"])


OOM_SCRIPT = '''import torch
import phalanx

with phalanx.init(seed=0, out="run", memory_history=100000) as run:
    kept = [torch.empty(2**28, device=run.device) for _ in range(4)]  # 4 GiB recorded
    free, total = torch.cuda.mem_get_info(run.device)
    torch.empty(int(total), dtype=torch.uint8, device=run.device)  # more than the GPU has
'''


def test_an_out_of_memory_writes_the_allocators_snapshot(tmp_path):
    """`memory_history=N`: the OOM's one line names the snapshot, which torch's own
    viewer format holds (segments and the recorded trace)."""
    import pickle
    import subprocess
    import sys

    (tmp_path / "oom.py").write_text(OOM_SCRIPT)
    proc = subprocess.run([sys.executable, "oom.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    path = tmp_path / "run" / "memory-snapshot-rank-0.pickle"
    assert f"allocator events are in run/memory-snapshot-rank-0.pickle" in proc.stderr or \
        str(path) in proc.stderr, proc.stderr[-3000:]
    snapshot = pickle.loads(path.read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"][0], list(snapshot)
