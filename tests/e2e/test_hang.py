"""Planted faults on 2 gloo ranks, each diagnosed with the right rank and place: a barrier
only rank 0 reaches, all_reduce of different shapes, seed 002's trainer, a replica
perturbed in training, and a rank that dies mid-step."""

from __future__ import annotations

import re
from pathlib import Path

from test_fault_tolerance import train

from procs import watch

SEED_002 = Path(__file__).parents[1] / "lint_seeds" / "seed002_block08.py"

# The guide's trainer with only its sizes made small for 2 CPU ranks, `set_device`
# guarded (the guide calls it unconditionally, which fails without CUDA) and no file
# written. Its bug is untouched: run_val() all-reduces and is called only under is_main().
SEED_002_CHANGES = [
    ("BLOCK_SIZE = 256", "BLOCK_SIZE = 16"), ("BATCH_SIZE = 32", "BATCH_SIZE = 4"),
    ("EPOCHS = 3", "EPOCHS = 2"), ("    VOCAB = 8000", "    VOCAB = 64"),
    ('    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))',
     '    if torch.cuda.is_available(): torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))'),
    ("(500_000,)", "(600,)"), ("(50_000,)", "(200,)"),
    ("num_workers=4, pin_memory=True", "num_workers=0, pin_memory=False"),
    ("num_workers=2, pin_memory=True", "num_workers=0, pin_memory=False"),
    ("n_embed=384, n_head=6, n_layer=6", "n_embed=32, n_head=2, n_layer=1"),
    ('torch.save(model.module.state_dict(), "minigpt_ddp.pt")', "pass"),
]


def seed_002_trainer(directory: Path) -> Path:
    source = SEED_002.read_text()
    for old, new in SEED_002_CHANGES:
        assert old in source, old
        source = source.replace(old, new)
    path = directory / "seed002_trainer.py"
    path.write_text(source)
    return path

BARRIER_ON_RANK_0 = '''import time, torch  # (one line: the report's line numbers below)
import torch.distributed as dist


def log_and_sync(step):
    dist.barrier()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(3)
    for step in range(3):
        dist.all_reduce(t); open(f"mark-rank{rank}", "w").write(str(time.time()))  # noqa
    if rank == 0:
        log_and_sync(step)
    dist.all_reduce(t)
    dist.destroy_process_group()


main()
'''

SHAPES = '''import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(3 if dist.get_rank() == 0 else 4)
dist.all_reduce(t)
dist.destroy_process_group()
'''


def test_a_barrier_only_rank_0_reaches_is_reported_with_rank_and_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BARRIER_ON_RANK_0)
    proc = watch(script, "--hang-timeout-s", "4", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = (tmp_path / "hang-report.txt").read_text()
    assert "rank 0: in barrier at train.py:6 in log_and_sync() (called from main), under " \
           "`if rank == 0:` at train.py:15" in report, report
    assert "rank 1: in all_reduce at train.py:17 in main()" in report, report
    assert "rank(s) 0 are in barrier" in proc.stderr and "they never join it" in proc.stderr
    stuck = max(float((tmp_path / f"mark-rank{r}").read_text()) for r in (0, 1))
    came = (tmp_path / "hang-report.txt").stat().st_mtime - stuck  # start-up apart
    assert came < 4 + 10, came  # the timeout + 10 s after the last rank's last progress


def test_all_reduce_of_different_shapes_is_explained(tmp_path):
    script = tmp_path / "shapes.py"
    script.write_text(SHAPES)
    proc = watch(script, "--debug-collectives", cwd=tmp_path)
    assert proc.returncode == 1
    assert "collective mismatch at collective #0: rank 0 runs allreduce of float32[3] at " \
           "shapes.py:6 (`dist.all_reduce(t)`), but rank 1 runs allreduce of float32[4] — " \
           "the shapes differ" in proc.stderr, proc.stderr[-3000:]
    assert "CollectiveFingerPrint" not in proc.stderr.splitlines()[-1]


def test_seed_002_trainer_is_diagnosed(tmp_path):
    """On gloo the guide's deadlock aborts rank 0 (the peer's gradient bucket does not fit
    rank 0's 4-byte all_reduce); the crash record names the call and its rank condition."""
    proc = watch(seed_002_trainer(tmp_path), "--hang-timeout-s", "20", cwd=tmp_path)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "rank 0 exited with code -6 (killed by signal 6) in all_reduce at " in last, last
    assert "seed002_trainer.py:124 in run_val() (called from main), under `if is_main():` " \
           "at seed002_trainer.py:145" in last, last
    # gloo's own check, from rank 0's log: the bucket's bytes into its 4-byte all_reduce
    assert re.search(r"gloo aborted: a peer sent \d{4,} bytes where 4 were expected", last), last


def test_the_trainer_reports_a_planted_hang(tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path / "run", small_corpus_file, cache_dir, "rank=0,step=3,action=hang",
                 "--hang-timeout-s", "4")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = (tmp_path / "run" / "hang-report.txt").read_text()
    assert "rank 0: in barrier at " in report and "faults.py" in report, report
    assert "rank 1: in all_reduce at " in report, report
    assert "the hang watchdog on rank 0 stopped it" in proc.stderr


def test_a_perturbed_replica_is_named(tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path / "run", small_corpus_file, cache_dir,
                 "rank=1,step=2,action=perturb", "--check-consistency-every", "1")
    assert proc.returncode == 1
    assert "the replicas' parameters and buffers have diverged: `wte.weight` differs on " \
           "rank(s) 1 from rank(s) 0" in proc.stderr, proc.stderr[-2000:]


def test_a_rank_that_dies_mid_step_is_reported_by_the_survivor(tmp_path, small_corpus_file,
                                                               cache_dir):
    proc = train(tmp_path / "run", small_corpus_file, cache_dir, "rank=1,step=2,action=kill")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "rank 1 exited with code -9 (killed by signal 9)" in last, last
    assert "when nobody sent it, it is the kernel's out-of-memory killer (`dmesg -T" in last
    assert "the plan predicts per rank at its peak, for this run's flags: ddp " in last, last


def test_the_trainer_runs_with_collective_verification(tmp_path, small_corpus_file, cache_dir):
    """torch 2.13 segfaults building DDP on a verifying group; Phalanx gives DDP a plain one."""
    proc = train(tmp_path / "run", small_corpus_file, cache_dir, "", "--debug-collectives",
                 "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
