"""`phalanx train`: check everything that can be checked before launching, then launch
workers (or, under torchrun/SLURM, be one) and train on the public API."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from phalanx.config import Config
from phalanx.data.corpus import TokenSplits, prepare
from phalanx.envinfo import under_launcher
from phalanx.errors import UserError
from phalanx.options import add_config_flags, resolve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)


def prepare_out_dir(path: str) -> Path:
    """Create the run directory and prove it is writable, or say why it is not."""
    out = Path(path).expanduser()
    probe = out / f".phalanx-write-test-{os.getpid()}"  # one per rank: no race
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"`--out` `{path}` is not a writable directory ({exc.strerror}). "
                        f"Choose a directory you can write to.") from None
    return out


def check_data_fits(cfg: Config, splits: TokenSplits) -> None:
    """Both splits must hold at least one window of `block_size + 1` tokens."""
    need = cfg.model.block_size + 1
    for name, n in (("training", splits.n_train), ("validation", splits.n_val)):
        if n < need:
            raise UserError(
                f"`--block-size` {cfg.model.block_size} is longer than the corpus allows: the "
                f"{name} split of `{splits.description}` has {n} tokens and one sample needs "
                f"{need}. Use a smaller `--block-size` or more text in `--data`.")


def check_world(cfg: Config, nproc: int, cuda: bool) -> None:
    """Checks that need the world size and device kind, done before any worker starts."""
    if cfg.dist.strategy == "single" and nproc > 1:
        raise UserError(f"`--strategy single` with `--nproc-per-node {nproc}` would train "
                        f"{nproc} unrelated copies. Use `--strategy ddp` or `--nproc-per-node 1`.")
    if cfg.dist.sync_batchnorm and not cuda:
        raise UserError("`--sync-batchnorm` needs CUDA GPUs (torch's SyncBatchNorm only runs on "
                        "GPU modules) and none is visible. Drop the flag on CPU.")
    if cfg.dist.backend == "nccl" and not cuda:
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo.")


def run_train(ns: argparse.Namespace, argv: list[str]) -> int:
    cfg = resolve(ns)
    out = prepare_out_dir(cfg.train.out)
    splits = prepare(cfg.data.path, cfg.data.cache_dir, cfg.data.val_fraction)
    check_data_fits(cfg, splits)
    from phalanx.train.checkpointing import precheck

    precheck(cfg, out)
    return launch_or_work(cfg, "train", argv, lambda threads: worker(cfg, splits, out, threads))


def launch_or_work(cfg: Config, verb: str, argv: list[str], work) -> int:
    """Under a launcher: be the worker (`work(None)`). Otherwise start the ranks through
    the elastic agent, each re-entering `phalanx VERB ARGV`; one rank runs in-process."""
    if under_launcher():
        return work(None)
    import torch

    from phalanx.launch import default_nproc, launch_workers, threads_per_rank

    nproc = cfg.dist.nproc_per_node or default_nproc()
    check_world(cfg, nproc, torch.cuda.is_available())
    threads = threads_per_rank(nproc, cfg.dist.threads_per_rank)
    if cfg.dist.debug_collectives:  # read when workers import torch.distributed
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if nproc == 1:
        return work(threads)
    launch_workers(["-m", "phalanx", verb, *argv], nproc, threads=threads,
                   max_restarts=cfg.dist.max_restarts)
    return 0


def init_run(cfg: Config, threads: int | None, out: Path | None = None):
    """`phalanx.init` with the config's backend, strategy and its options; the hang
    watchdog reports into `out`."""
    import phalanx

    d = cfg.dist
    return phalanx.init(cfg.train.seed, backend=d.backend, strategy=d.strategy,
                        timeout_s=d.timeout_s, threads=d.threads_per_rank or threads,
                        hang_timeout_s=d.hang_timeout_s or None, hang_report_dir=out,
                        debug_collectives=d.debug_collectives, **strategy_options(cfg))


def strategy_options(cfg: Config) -> dict:
    """The strategy's options from the config.

    `static_graph` applies only without accumulation: under it torch cannot skip the
    gradient sync before its first synchronised iteration, so the first window would
    sync every micro-step — the same gradient up to float rounding, but not bit-for-bit
    the windows that follow or a resumed run's first one.
    """
    d = cfg.dist
    return {"bucket_cap_mb": d.bucket_cap_mb, "gradient_as_bucket_view": d.gradient_as_bucket_view,
            "static_graph": d.static_graph and cfg.train.grad_accum == 1,
            "find_unused_parameters": d.find_unused_parameters,
            "sync_batchnorm": d.sync_batchnorm}


def worker(cfg: Config, splits: TokenSplits, out: Path, threads: int | None = None) -> int:
    """One rank: init the runtime, train, and (rank 0) write the results."""
    from phalanx.train.finish import finish, banner
    from phalanx.train.loop import train

    with init_run(cfg, threads, out) as run:
        run.print(banner(cfg, run, splits))
        if run.is_main:
            (out / "run_config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        result = train(cfg, run, splits, out)
        if run.is_main:
            finish(cfg, run, result, out)
    return 0  # closing the run waits for rank 0's writing (a barrier)
