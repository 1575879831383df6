"""`phalanx verify-resume`'s work on each rank: N steps straight, N/2 + a committed
checkpoint + resume to N (a new model, optimizer and data loader, loaded from disk), in
scratch directories beside the run directory; then every difference between the two —
the samples read and their order, the per-step losses, the final weights and the
optimizer state, bit for bit — gathered, and rank 0's verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.cluster.protocol import phalanx_worker
from phalanx.config.sections import Config
from phalanx.paths import RunDir, atomic_write, check_run_dir, refuse_link, remove_tree
from phalanx.train.worker import init_run

if TYPE_CHECKING:
    import torch

VERDICT = "verdict.txt"


def phase_config(cfg: Config, out: Path, steps: int, resume: str) -> Config:
    train = dataclasses.replace(cfg.train, out=str(out), max_steps=steps, resume=resume,
                                lr_decay_steps=cfg.decay_steps(), checkpoint_every=0,
                                sample_tokens=0)
    return dataclasses.replace(cfg, train=train)


def first_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """Where two flat tensor dicts first differ (name, and how), or None if bitwise equal."""
    import torch

    from phalanx.strategies.tensors import local_tensor

    if a.keys() != b.keys():
        return f"different entries: {sorted(set(a) ^ set(b))[:3]}"
    for name in a:
        x, y = local_tensor(a[name]), local_tensor(b[name])
        if x.shape != y.shape:
            return f"`{name}` has shape {tuple(x.shape)} vs {tuple(y.shape)}"
        if not torch.equal(x, y):
            diff = (x.double() - y.double()).abs().max().item()
            return f"`{name}` differs (max abs difference {diff:.3g})"
    return None


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's optimizer state (`opt`: the strategy's local optimizer), by parameter
    index."""
    import torch

    names = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    flat = {}
    for p, state in opt.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                flat[f"param {names[id(p)]} {key}"] = value
    return flat


def first_list_difference(what: str, a: list, b: list, per_step: int) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"{what} differ first at step {i // per_step + 1}: {x} straight vs {y} resumed"
    if len(a) != len(b):
        return f"{what}: {len(a)} straight vs {len(b)} resumed"
    return None


def compare(straight, halves: list, ids: tuple[list[int], list[int]], per_step: int,
            local=lambda opt: opt) -> list[str]:
    """Every difference found on this rank, most telling first ([] = exact)."""
    resumed_losses = halves[0].losses + halves[1].losses
    found = [
        first_list_difference("training samples", ids[0], ids[1], per_step),
        first_list_difference("losses", straight.losses, resumed_losses, 1),
        first_difference(straight.model.state_dict(), halves[1].model.state_dict()),
        first_difference(optimizer_tensors(local(straight.optimizer)),
                         optimizer_tensors(local(halves[1].optimizer))),
    ]
    labels = ["data order", "losses", "weights", "optimizer state"]
    return [f"{label}: {text}" for label, text in zip(labels, found) if text]


PHASES = ("straight", "halves")


def scratch_dir(out: str) -> Path:
    """Where verify-resume trains: beside the run directory `--out`, never in it (the
    user's checkpoints, logs and metrics stay untouched), on the same file system (every
    machine of a multi-node job sees it)."""
    out_path = Path(os.path.abspath(Path(out).expanduser()))  # `--out .` has a name too
    return out_path.parent / f"{out_path.name}-verify-resume"


def prepare_scratch(out: str) -> RunDir:
    """Make `scratch_dir(out)`, verify-resume's own directory: a link there or in it
    (planted: verify-resume makes none) is refused before anything is written or removed
    through it."""
    from phalanx.checkpoint.rundir import prepare_out_dir

    root = scratch_dir(out)
    where = "where verify-resume trains (its own directory beside `--out`)"
    hint = f"Remove the link: verify-resume makes `{root.name}` itself."
    refuse_link(root, where, hint)
    check_run_dir(root)
    made = prepare_out_dir(str(root))
    refuse_link(root, where, hint)  # planted between the check and the mkdir
    return made


def clear(root: RunDir | Path, logs: bool = False) -> None:
    """Remove what verify-resume writes in `root` (its phases, the verdict; with `logs`
    the ranks' logs too), then `root` itself if that left it empty."""
    for name in (*PHASES, VERDICT, *(("logs",) if logs else ())):
        remove_tree(root / name)  # a link there is unlinked, never followed
    with contextlib.suppress(OSError):
        Path(root).rmdir()  # (a RunDir has no rmdir)


def work(cfg: Config, splits, root: RunDir, threads: int | None, choice=None) -> int:
    from phalanx.train.loop import train  # torch: in the ranks, not the launching process

    n, half = cfg.train.max_steps, cfg.train.max_steps // 2
    with init_run(cfg, threads, root, choice) as run:  # a hang report goes there too
        if run.is_main:
            clear(root)
        run.barrier()
        straight_ids: list[int] = []
        resumed_ids: list[int] = []
        run.print(f"verify-resume: {n} steps straight, then {half} + resume + {n - half} "
                  f"on {run.world_size} rank(s), in {root}/ (not --out)…")
        straight = train(phase_config(cfg, root / "straight", n, "never"), run, splits,
                         root / "straight", samples=straight_ids)
        first = train(phase_config(cfg, root / "halves", half, "never"), run, splits,
                      root / "halves", samples=resumed_ids)
        second = train(phase_config(cfg, root / "halves", n, "auto"), run, splits,
                       root / "halves", samples=resumed_ids)
        per_step = cfg.train.micro_batch_size * cfg.train.grad_accum
        problems = compare(straight, [first, second], (straight_ids, resumed_ids), per_step,
                           run.strategy.local_optimizer)
        verdicts = run.gather_objects(problems)
        code = report(run, verdicts, n, len(straight_ids),
                      (straight.losses[-1:], second.losses[-1:]))
        if run.is_main:
            atomic_write(root / VERDICT, str(code))
    # under Phalanx's launcher the parent reads the verdict; failing ranks would read
    # as a crashed job there
    return 0 if phalanx_worker() else code


def report(run, verdicts: list[list[str]], steps: int, samples: int,
           finals: tuple[list[float], list[float]] = ([], [])) -> int:
    """The verdict on rank 0; `finals`: the last step's loss, straight and resumed —
    the progress lines above average over windows of steps that differ between the
    runs (the halves log at N/2), so their figures differ where the steps do not."""
    bad = [(rank, p) for rank, problems in enumerate(verdicts) for p in problems]
    if finals[0] and finals[1]:
        run.print(f"compared: step {steps} loss {finals[0][0]!r} straight, "
                  f"{finals[1][0]!r} resumed (the progress lines above average over "
                  f"different windows of steps, so they need not match)")
    if not bad:
        run.print(f"PASS: resume is exact — {steps} losses, the {samples} samples per rank and "
                  f"their order, every weight and optimizer tensor are bitwise identical on "
                  f"all {len(verdicts)} rank(s).")
        return 0
    run.print("FAIL: resume is not exact. First difference(s):")
    for rank, problem in bad[:8]:
        run.print(f"  [rank {rank}] {problem}")
    return 1
