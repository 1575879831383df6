"""One rank of `phalanx train`: the runtime joined with the config's strategy, the settings
agreed, the loop run, and (rank 0) the results written."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

from phalanx.cluster.env import global_rank
from phalanx.cluster.lifecycle import StopSignals, exit_code
from phalanx.cluster.protocol import (
    in_replica_group,
    phalanx_worker,
    under_launcher,
)
from phalanx.cluster.rendezvous import restart_attempt
from phalanx.cluster.startup_trace import mark
from phalanx.config.sections import Config
from phalanx.config.strategy import StrategyChoice, choose
from phalanx.data.corpus import TokenSplits
from phalanx.errors import FinishedElsewhere, UserError
from phalanx.errors import stopped_line as said_stopped
from phalanx.paths import RunDir
from phalanx.runtime.choice import choose_here


def check_data_fits(cfg: Config, splits: TokenSplits) -> None:
    """Both splits must hold at least one window of `block_size + 1` tokens."""
    need = cfg.model.block_size + 1
    for name, n in (("training", splits.n_train), ("validation", splits.n_val)):
        if n < need:
            raise UserError(
                f"`--block-size` {cfg.model.block_size} is longer than the corpus allows: the "
                f"{name} split of `{splits.description}` has {n} tokens and one sample needs "
                f"{need}. Use a smaller `--block-size` or more text in `--data`.")


def check_model(cfg: Config, vocab_size: int) -> None:
    """`--model`: the factory builds a module (on the meta device) whose logits fit the
    tokenizer's vocabulary, before anything is launched (MiniGPT always does)."""
    if cfg.model.factory is not None:
        from phalanx.models.user import check_user_model

        check_user_model(cfg.model.factory, vocab_size, cfg.model.block_size)


def owns_run_dir(cfg: Config) -> bool:
    """Whether this process is the run directory's one writer-to-be: the launcher of a
    one-machine job, or under a launcher (torchrun, SLURM, Phalanx's own for several
    machines) the global rank 0. (Phalanx's own one-machine workers never ask: they start
    from the job their launcher, which holds the lock, hands them — `launch.job`.)"""
    if not under_launcher():
        return cfg.dist.node_range()[1] == 1  # several machines: global rank 0 locks
    return global_rank() == 0


def complete_quietly(cfg: Config, out: RunDir) -> bool:
    """Rank > 0 under another launcher: does rank 0 find the run complete? (Read-only;
    any error is rank 0's to report, so it means 'no' here.)"""
    from phalanx.train.checkpointing import precheck
    from phalanx.train.outputs import missing_outputs

    try:
        return precheck(cfg, out)[1] is not None and not missing_outputs(cfg, out)
    except Exception:  # noqa: BLE001 - rank 0 reports it in one line
        return False


def stopped_line(signum: int, out: RunDir, argv: list[str]) -> str:
    """`stopped by SIGINT: checkpoint step-… is committed. Resume with: phalanx train …`"""
    from phalanx.checkpoint.store import committed_note

    if in_replica_group():  # its launcher (phalanx.ft.groups) says how to resume, once
        return said_stopped(signum, committed_note(out), None)
    args, skip = [], False
    for a in argv:  # the resume command continues: no `--resume never` / PATH
        if skip or a == "--resume" or a.startswith("--resume="):
            skip = a == "--resume"
            continue
        args.append(a)
    return said_stopped(signum, committed_note(out), shlex.join(["phalanx", "train", *args]))


def init_run(cfg: Config, threads: int | None, out: RunDir | Path | None = None,
             choice: StrategyChoice | None = None):
    """`phalanx.init` with the config's backend and the strategy chosen once for the world
    it joins (`choice`: decided already by this process, as the launcher of a rank it runs
    itself); the hang watchdog reports into `out`."""
    import phalanx

    d = cfg.dist
    return phalanx.init(cfg.train.seed, backend=d.backend,
                        strategy=choose_strategy(cfg) if choice is None else choice,
                        timeout_s=d.timeout_s, threads=d.threads_per_rank or threads,
                        hang_timeout_s=d.hang_timeout_s or None, hang_report_dir=out,
                        debug_collectives=d.debug_collectives, trackers=cfg.train.trackers,
                        memory_history=cfg.train.memory_history,
                        straggler_every=d.straggler_every)


def choose_strategy(cfg: Config, world: int | None = None) -> StrategyChoice:
    """The run's strategy with its options (`config.strategy.choose`), for `world` ranks
    or (None) the world this process joins — the one `phalanx.init` reads."""
    if world is None:
        return choose_here(cfg.dist, cfg.train.grad_accum)
    return choose(cfg.dist, world, cfg.train.grad_accum)


def strategy_options(cfg: Config, world: int | None = None) -> dict:
    """The chosen strategy's options from the config, as keywords (its spec's fields only,
    settled for the run's accumulation)."""
    return choose_strategy(cfg, world).kwargs()


def worker(cfg: Config, splits: TokenSplits, out: RunDir, threads: int | None = None,
           argv: list[str] | None = None, choice: StrategyChoice | None = None,
           verified: str | None = None) -> int:
    """One rank: init the runtime, train, and (rank 0) write the results (`verified`: the
    checkpoint the launcher verified in full, its job's token). Stopped by a
    signal: commit a checkpoint, say how to resume, exit 130 (SIGINT) / 143 (SIGTERM).
    A signal once every step is done does not stop the final outputs (seconds): the
    run is complete, it writes them and exits 0."""
    # one stop-signal scope from the process group to its end: a first signal before the
    # loop is agreed at its first step; after it, the outputs are still written; and the
    # closing barrier is inside it too — a rank waiting there while rank 0 writes the
    # outputs takes a copy of the signal (the launcher forwards what a Ctrl-C also
    # delivered) as the same request, not as a KeyboardInterrupt that exits 130
    with init_run(cfg, threads, out, choice) as run, \
            run.catch_stop_signals(lambda signum: _acknowledge(run, cfg, signum)):
        code = _train(cfg, run, splits, out, argv, verified)
        run.close()
    return code


def _train(cfg: Config, run, splits: TokenSplits, out: RunDir, argv: list[str] | None,
           verified: str | None) -> int:
    from phalanx.train.agreement import check_agreement
    from phalanx.train.finish import banner, finish
    from phalanx.train.loop import train

    mark("process group up")
    check_agreement(run, cfg, splits)  # every rank: the same settings, or one line
    if not restart_attempt():  # a restart says so in one line when it resumes
        run.print(banner(cfg, run, splits))
    try:
        result = train(cfg, run, splits, out, verified=verified)
    except FinishedElsewhere as exc:  # torchft: a group restarted after another finished
        run.print(f"phalanx: {exc}")
        return 0
    if result.stopped and result.state.step < cfg.train.max_steps:
        if run.is_main and not phalanx_worker():  # else the launcher
            print(f"phalanx: {stopped_line(result.stopped, out, argv or [])}",
                  file=sys.stderr, flush=True)
        return exit_code(result.stopped)  # closing the run waits for rank 0 (a barrier)
    finish(cfg, run, result, out, splits)  # every rank: sharded weights gathered
    if run.stop_signal_here():  # caught after the last step's stop check: no stop
        run.print(f"phalanx: {signal.Signals(run.stop_signal_here()).name} came after "
                  f"the last step: the run is complete and every output is written.")
    return 0


def _acknowledge(run, cfg: Config, signum: int) -> None:
    """Said at once (rank 0, from the signal watcher; on stdout, with the progress: stderr
    keeps its one line on how the run ended) when the first stop signal arrives: at
    which step, and what happens next."""
    name, done, total = signal.Signals(signum).name, run.optimizer_steps, cfg.train.max_steps
    then = ("the run is complete: its outputs are written, then it exits" if done >= total
            else "stopping after the step in progress (a checkpoint is committed, then "
                 "every rank exits)")
    run.print(f"phalanx: {name} received after step {done} of {total}: {then}; another "
              f"{name} more than {StopSignals.GRACE_S:g} s from now stops at once")
