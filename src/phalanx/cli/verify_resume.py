"""`phalanx verify-resume [train options]`: prove that resume is exact for *your* config.

In one launch (the same ranks, backend and options as `phalanx train` would use), it
trains N = `--max-steps` steps straight, then N/2 steps, commits a checkpoint, and
resumes from it (a new model, optimizer and data loader, loaded from disk) to N. The
learning-rate schedule keeps the N-step horizon in both halves. It then compares, on
every rank: the per-step losses, the training samples read and their order, the final
weights and the optimizer state — bit for bit — and prints a verdict with the first
difference. Exit 0 when everything is identical, 1 otherwise.

The resume happens in the same processes, so it does not exercise a process restart
(the test suite does that with `--max-restarts` and PHALANX_FAULT): state kept outside
the model, optimizer, checkpoint and config — a global a script sets once — would be
carried over here and lost in a real restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from phalanx.cluster.protocol import under_launcher
from phalanx.config.flags import add_config_flags, resolve
from phalanx.errors import UserError
from phalanx.train.verify import VERDICT, clear, prepare_scratch, scratch_dir, work

SUMMARY = "Check that resuming is bit-exact for this configuration (N straight vs N/2 + resume)."


# set by verify-resume itself (resume, checkpoints), or about a long run it does not make:
# accepted (the same command line as `phalanx train` works) but not listed in --help
NOT_HERE = ("train.resume", "train.sample_tokens", "train.checkpoint_every",
            "train.keep_checkpoints", "train.spike_factor", "dist.max_restarts",
            "dist.straggler_every")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser, hide=NOT_HERE)


def run_verify_resume(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.data.corpus import check_data, prepare_data
    from phalanx.launch.ranks import run_ranks
    from phalanx.train.worker import check_data_fits, check_model

    cfg = resolve(ns)
    if cfg.train.max_steps < 2:
        raise UserError(f"`--max-steps` must be at least 2 to split the run in halves, got "
                        f"{cfg.train.max_steps}.")
    check_data(cfg.data, str(scratch_dir(cfg.train.out)))  # `--data`, `--tokenizer`
    # readable (and where it trains not in `--data`) before anything is written
    root = prepare_scratch(cfg.train.out)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, out=str(root)))
    splits = prepare_data(cfg.data)
    check_data_fits(cfg, splits)
    check_model(cfg, splits.vocab_size)
    code = run_ranks(cfg, "verify-resume", argv,  # the ranks' logs: root/logs
                     lambda threads, choice: work(cfg, splits, root, threads, choice),
                     root)
    if code == 0 and (root / VERDICT).is_file():
        code = int((root / VERDICT).read_text())
    if under_launcher():  # every rank gets here: the launching command cleans up, if any
        return code
    if code == 0:
        clear(root, logs=True)
    else:
        print(f"phalanx: verify-resume: its runs and logs are kept in {root}/",
              file=sys.stderr, flush=True)
    return code
