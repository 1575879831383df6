"""The resume scenarios of the conformance matrix (docs/conformance.md) and the libraries it
runs them with: how each is launched, and each life's command line.

Every scenario trains common.py's task (96 samples, 2 epochs) and is run twice per library:
a reference run, uninterrupted, with the first life's settings and no checkpoint flags; and
the lives, in one run directory, each but the last killed after its optimizer step
`kill_after` (+ one micro-batch), each but the first with `--resume`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# library -> its script (in this folder); phalanx is launched by `phalanx run`, the others
# by torchrun
LIBRARIES = {
    "phalanx": "phalanx_script.py",
    "torch": "torch_script.py",
    "accelerate": "accelerate_script.py",
    "accelerate_stateful": "accelerate_stateful_script.py",
    "lightning": "lightning_script.py",
    "fabric": "fabric_script.py",
}


@dataclass(frozen=True)
class Life:
    """One launch: ranks, samples per rank per micro-batch, strategy, and the optimizer step
    after which every rank kills itself (0: runs to the end)."""

    world: int = 2
    batch: int = 4
    strategy: str = "ddp"
    kill_after: int = 0


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    lives: tuple[Life, ...] = ()
    args: tuple[str, ...] = ()  # the task's flags, the same in every life and the reference
    checkpoint_every: int = 4
    tolerant: bool = False  # the reduction order may change: weights within a tolerance
    cuda_only: str = ""  # why it cannot run on CPU (the cell says so; nothing is run)

    def expected_checkpoint(self, life: int) -> int:
        """The step life `life` (>= 1) should resume from: the newest multiple of
        checkpoint_every at or before the previous life's kill."""
        killed = self.lives[life - 1].kill_after
        return killed - killed % self.checkpoint_every


def _two(kill: int) -> tuple[Life, ...]:
    """Two lives on 2 ranks: killed after step `kill`, then resumed to the end."""
    return Life(kill_after=kill), Life()


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("mid-epoch", "mid-epoch: checkpoint every 4, kill after 6", _two(6)),
    Scenario("epoch-boundary", "epoch boundary: checkpoint every 12, kill after 14",
             _two(14), checkpoint_every=12),
    Scenario("workers", "2 DataLoader workers: checkpoint every 4, kill after 6", _two(6),
             ("--workers", "2")),
    Scenario("shuffle-seed", "shuffle seed 7: checkpoint every 4, kill after 9", _two(9),
             ("--seed", "7")),
    Scenario("dropout", "dropout 0.2 (RNG): checkpoint every 4, kill after 6", _two(6),
             ("--dropout", "0.2")),
    Scenario("accumulation", "accumulation 2, killed mid-window: checkpoint every 2, kill "
             "after 3", _two(3), ("--grad-accum", "2"), checkpoint_every=2),
    Scenario("scheduler", "LR scheduler (StepLR): checkpoint every 4, kill after 6", _two(6),
             ("--scheduler",)),
    Scenario("world-down", "world 4 → 2 (batch 2 → 4 per rank): checkpoint every 4, kill "
             "after 6", (Life(4, 2, kill_after=6), Life(2, 4)), tolerant=True),
    Scenario("world-up", "world 2 → 4 (batch 4 → 2 per rank): checkpoint every 4, kill "
             "after 6", (Life(2, 4, kill_after=6), Life(4, 2)), tolerant=True),
    Scenario("strategy-change", "ddp → fsdp: checkpoint every 4, kill after 6",
             (Life(kill_after=6), Life(strategy="fsdp")), tolerant=True),
    Scenario("second-resume", "resumed twice: checkpoint every 4, killed after 6 and 15",
             (Life(kill_after=6), Life(kill_after=15), Life())),
    Scenario("fp16", "fp16 loss scale", cuda_only="n/a on CPU (CUDA tier)"),
)
BY_NAME = {s.name: s for s in SCENARIOS}


def script_args(out: Path, scenario: Scenario, life: Life, index: int | None) -> list[str]:
    """The script's own arguments (common.parser()). `index`: the life's number, or None
    for the reference run (no checkpoint flags)."""
    args = ["--out", str(out), "--batch-size", str(life.batch), "--strategy", life.strategy,
            *scenario.args]
    if index is None:
        return args
    args += ["--life", str(index), "--checkpoint-every", str(scenario.checkpoint_every)]
    if life.kill_after:
        args += ["--kill-after-step", str(life.kill_after)]
    if index > 0:
        args.append("--resume")
    return args


def command(library: str, world: int, out: Path, args: list[str]) -> list[str]:
    """How `library`'s script is launched on `world` local ranks."""
    script = str(HERE / LIBRARIES[library])
    if library == "phalanx":
        return [sys.executable, "-m", "phalanx", "run", "--nproc-per-node", str(world),
                "--out", str(out), script, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(world), script, *args]


def written(library: str) -> bool:
    return (HERE / LIBRARIES[library]).is_file()
