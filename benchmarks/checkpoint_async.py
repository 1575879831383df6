"""Checkpoint cost: async save's training stall vs a synchronous save, and the
synchronous save's throughput vs the disk's raw sequential write speed — one run.

Per repeat (alternating which goes first): a synchronous `run.save` of MiniGPT + AdamW
state (the slowest rank's wall time is the stall), and an asynchronous one (the stall is
the time until `run.save` returns; the write and commit then go on in a thread while
training steps run, and the benchmark also reports how much slower those steps were).
The raw disk figure: rank 0 alone writes the same number of bytes in 4 MiB blocks to one
new file, fsyncs and deletes it, on the same filesystem, in the same run, in turn with the
synchronous save (which goes first rotating). A second raw write, for reference, also
starts the disk write every 8 MiB as the checkpoint writer does (the ceiling for a writer
that overlaps serialising with the disk). On this VM, writing into never-touched memory
is ~4x slower than into memory a deleted file just gave back, which alone moved the
per-repeat ratio between 0.2 and 2.8; so before each of the three, an untimed file of
the same size is written and deleted, and each writes into memory the kernel has just
had back. One save before the repeats is not timed.
Medians over repeats.

    python benchmarks/checkpoint_async.py [--preset small] [--nproc 2] [--repeats 5] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def slowest(run, seconds: float) -> float:
    return max(per_rank(seconds))


def per_rank(seconds: float) -> list[float]:
    """Every rank's `seconds`, on every rank."""
    import torch
    import torch.distributed as dist

    out = [torch.zeros((), dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor(seconds, dtype=torch.float64))
    return [t.item() for t in out]


def raw_write(directory: Path, n_bytes: int, streamed: bool = False) -> float:
    """Seconds to write n_bytes sequentially (4 MiB blocks) to a new file and fsync.
    `streamed`: also start the disk write every WRITEBACK_EVERY bytes, as the checkpoint
    writer does (the disk's ceiling for a writer that overlaps; for reference)."""
    from phalanx.checkpoint.writer import START_WRITEBACK, WRITEBACK_EVERY

    block = os.urandom(4 << 20)
    path = directory / "raw-write.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for i in range(max(1, n_bytes // len(block))):
            fh.write(block)
            done = (i + 1) * len(block)
            if streamed and START_WRITEBACK and done % WRITEBACK_EVERY == 0:
                fh.flush()
                START_WRITEBACK(fh.fileno(), done - WRITEBACK_EVERY, WRITEBACK_EVERY)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return seconds


def give_back_memory(directory: Path, n_bytes: int) -> None:
    """Write and delete an untimed file of n_bytes, so the timed write that follows goes
    into memory the kernel has just had back (see the module docstring)."""
    path = directory / "ballast.bin"
    block = bytes(4 << 20)
    with open(path, "wb") as fh:
        for _ in range(max(1, n_bytes // len(block))):
            fh.write(block)
    path.unlink()


def steps_timed(step, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


MODES = {"sync": {}, "async": {"asynchronous": True, "overlap_staging": True},
         "async_copy_first": {"asynchronous": True}, "raw": None, "raw_streamed": None}


def one_repeat(run, model, opt, step, root: Path, r: int, args, n_bytes: int) -> dict:
    """A synchronous save and the two raw writes (in turn, which goes first rotating),
    the two background saves (alternating), then the steps alone."""
    out = {}
    trio = ["sync", "raw", "raw_streamed"]
    first, background = trio[r % 3:] + trio[:r % 3], ["async", "async_copy_first"]
    for i, mode in enumerate(first + background[::1 - 2 * (r % 2)]):
        if mode in trio and run.is_main:
            give_back_memory(Path(args.dir), n_bytes)
        run.barrier()
        if mode.startswith("raw"):
            seconds = raw_write(Path(args.dir), n_bytes, mode == "raw_streamed") \
                if run.is_main else 0.0
            out[mode] = slowest(run, seconds)
            continue
        t0 = time.perf_counter()
        run.save(root, len(MODES) * r + i + 1, model, opt, keep=2, **MODES[mode])
        out[f"{mode}_ranks"] = per_rank(time.perf_counter() - t0)
        out[f"{mode}_stall"] = max(out[f"{mode}_ranks"])  # the slowest rank
        if mode != "sync":  # training goes on while the write runs
            out[f"{mode}_steps"] = slowest(run, steps_timed(step, args.steps))
            run.wait_checkpoint()
        timings = run.checkpoint_timings  # complete now that the save has finished
        out[f"{mode}_write"] = slowest(run, timings["write"])
        if mode != "sync":
            # the stall also counts the wait for the copy before the next optimizer step
            out[f"{mode}_staged_wait"] = slowest(run, timings.get("staged_wait", 0.0))
            out[f"{mode}_stall"] += out[f"{mode}_staged_wait"]
        out[f"{mode}_begin"] = slowest(run, timings["begin"])
        out[f"{mode}_state_dict"] = slowest(run, timings["state_dict"])
        out[f"{mode}_commit"] = timings.get("commit", 0.0)
        out[f"{mode}_reread"] = timings.get("reread_bytes", 0)
    out["steps_alone"] = slowest(run, steps_timed(step, args.steps))
    return out


def worker(args) -> None:
    import phalanx
    from phalanx.config.sections import build_config
    from phalanx.data.corpus import prepare_data

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from phalanx.bench.peers import phalanx as phalanx_step

    cfg = build_config({"model": {"preset": args.preset}, "train": {"micro_batch_size": 2}})
    splits = prepare_data(cfg.data)
    root = Path(args.dir) / "checkpoints"
    with phalanx.init(cfg.train.seed) as run:
        step = phalanx_step(cfg, splits.load("train"), run)
        model, opt = step.model, step.opt
        step()  # optimizer state exists from here on
        first = run.save(root, 0, model, opt, keep=2)  # untimed; gives the size
        size = sum(p.stat().st_size for p in first.iterdir())
        results = [one_repeat(run, model, opt, step, root, r, args, size)
                   for r in range(args.repeats)]
        if run.is_main:
            params = sum(p.numel() for p in model.parameters())
            Path(args.result).write_text(json.dumps(
                {"repeats": results, "bytes": size, "params": params,
                 "world_size": run.world_size}))
        run.barrier()


def report(data: dict, args) -> None:
    med = {k: statistics.median(r[k] for r in data["repeats"]) for k in data["repeats"][0]
           if not k.endswith("_ranks")}
    mb = data["bytes"] / 1e6
    raw = med["raw"]
    pairs = sorted((r["raw"] / r["sync_stall"], r["sync_stall"], r["raw"])
                   for r in data["repeats"])
    sync = med["sync_stall"]
    print(f"state: MiniGPT `{args.preset}` {data['params'] / 1e6:.1f}M params + AdamW = "
          f"{mb:.0f} MB on disk, {data['world_size']} rank(s), {args.repeats} repeats (medians)")
    print(f"sync save                {sync * 1e3:8.1f} ms  (begin {med['sync_begin'] * 1e3:.1f}, "
          f"state dict {med['sync_state_dict'] * 1e3:.1f}, written after "
          f"{med['sync_write'] * 1e3:.1f}, commit: manifest + fsync + rename "
          f"{med['sync_commit'] * 1e3:.1f} ms; bytes read back to checksum "
          f"{med['sync_reread'] / 1e3:.0f} kB)")
    for mode, what in (("async", "the trainer's --async-checkpoint: copy overlapped"),
                       ("async_copy_first", "run.save(asynchronous=True): copy, then return")):
        print(f"{mode:16s} stall {med[f'{mode}_stall'] * 1e3:8.1f} ms  ({what}; begin "
              f"{med[f'{mode}_begin'] * 1e3:.1f}, state dict {med[f'{mode}_state_dict'] * 1e3:.1f}, "
              f"wait for the copy {med[f'{mode}_staged_wait'] * 1e3:.1f} ms; written after {med[f'{mode}_write'] * 1e3:.0f} ms)")
        ranks = zip(*(r[f"{mode}_ranks"] for r in data["repeats"]))
        print(f"    save call per rank (median): "
              f"{', '.join(f'{statistics.median(x) * 1e3:.1f}' for x in ranks)} ms")
        print(f"    stall ratio {mode} / sync = {med[f'{mode}_stall'] / sync:.3f} (goal <= 0.05); "
              f"steps during the write {med[f'{mode}_steps'] * 1e3:.0f} ms vs "
              f"{med['steps_alone'] * 1e3:.0f} alone "
              f"({med[f'{mode}_steps'] / med['steps_alone']:.2f}×)")
    print(f"sync save throughput {mb / sync:8.1f} MB/s vs raw sequential write "
          f"{mb / raw:.1f} MB/s: ratio of medians {raw / sync:.2f}; per repeat "
          f"{', '.join(f'{x:.2f} ({s * 1e3:.0f}/{w * 1e3:.0f} ms)' for x, s, w in pairs)} "
          f"(goal >= 0.8)")
    streamed = med["raw_streamed"]
    print(f"raw write starting the disk write every 8 MiB as the checkpoint writer does "
          f"(reference: the ceiling for a writer that overlaps) {mb / streamed:.1f} MB/s: "
          f"sync save / that = {streamed / sync:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="MiniGPT preset (tiny, small, "
                                                          "gpt2-124m)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps per measurement")
    parser.add_argument("--dir", default="", help="where to write (default: a temporary "
                                                  "directory under the current one)")
    parser.add_argument("--result", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from phalanx.launch.agent import launch_workers, threads_per_rank

    directory = Path(args.dir or tempfile.mkdtemp(prefix="phalanx-ckpt-bench-", dir="."))
    result = Path(args.result or directory / "result.json")
    argv = [__file__, "--worker", "--result", str(result), "--repeats", str(args.repeats),
            "--steps", str(args.steps), "--preset", args.preset, "--dir", str(directory)]
    try:
        launch_workers(argv, args.nproc, threads=threads_per_rank(args.nproc, None))
        report(json.loads(result.read_text()), args)
    finally:
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
