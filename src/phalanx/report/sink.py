"""Where a run's metrics go: `metrics.jsonl` always, and TensorBoard event files in
`OUT/tb/` when TensorBoard is installed (`install_command("tensorboard")`). The JSON
file never depends on TensorBoard; `phalanx report` and the plots read it.

Tags: `train/loss`, `val/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`,
`train/step_time_s`, `train/memory_mib`; a user's own metrics (`run.log`) keep their
names, with `/` as written (`eval/accuracy`), else under `train/`.

What a record lacks of the figures the report draws, the sink measures (`Pace`): the
step time, rank 0's peak memory, and tokens/s when the record counts the step's `tokens`.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.cluster.protocol import speaks_for_the_job
from phalanx.errors import UserError
from phalanx.paths import RunDir, atomic_write
from phalanx.report.metrics import MetricsWriter, read_metrics

_TAGS = {"loss": "train/loss", "val_loss": "val/loss", "lr": "train/lr",
         "val_nats_per_byte": "val/nats_per_byte"}


def tag_of(name: str) -> str:
    return _TAGS.get(name) or (name if "/" in name else f"train/{name}")


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401 - torch's SummaryWriter needs it
    except ImportError:
        return False
    return True


def install_command(extra: str) -> str:
    """How to add Phalanx's optional `extra`: from PyPI, or — for an editable install of
    a source checkout (pip's direct_url.json says so) — from that checkout."""
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        direct = json.loads(metadata.distribution("phalanx").read_text("direct_url.json")
                            or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        direct = {}
    if not direct.get("dir_info", {}).get("editable"):
        return f"pip install 'phalanx[{extra}]'"
    checkout = Path(unquote(urlparse(direct.get("url", "")).path) or ".")
    where = "." if checkout.resolve() == Path.cwd().resolve() else str(checkout)
    return f"pip install -e {shlex.quote(f'{where}[{extra}]')}"  # a path with a quote, too


def tensorboard_note(out_dir: RunDir | Path | None = None) -> str | None:
    """The note for a run without TensorBoard (said before its progress), once per run
    directory `out_dir`: None when it is installed, when `out_dir` already holds metrics
    (the run resumes: said when it began), or in a torchft replica group but the first."""
    if tensorboard_available() or not speaks_for_the_job():
        return None
    if out_dir is not None and RunDir(out_dir).metrics.exists():
        return None
    return ("phalanx: note: TensorBoard is not installed, so no OUT/tb/ event files "
            f"(metrics.jsonl has the same figures); `{install_command('tensorboard')}` "
            "adds them.")


class MetricsSink:
    """Rank 0's writer of `out/metrics.jsonl` and `out/tb/`, opened at the first step it
    logs: what the file holds from that step on belongs to a continuation that was lost
    (a resumed run) and is dropped — TensorBoard drops the same events (`purge_step`)."""

    def __init__(self, out_dir: Path, first_step: int,
                 say: Callable[[str], None] | None = None, device: Any = None) -> None:
        self.out_dir = out_dir = Path(out_dir)
        self.pace = Pace(device)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = RunDir(out_dir).metrics
        kept = drop_from(path, first_step, say)
        self.metrics = MetricsWriter(path, append=kept)
        self.tb = None
        if tensorboard_available():
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(RunDir(out_dir).tb),
                                    purge_step=first_step if kept else None)

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write `record` with what the sink measured added (`Pace`); that record."""
        record = self.pace.fill(record)
        self.metrics.write(record)
        if self.tb is None:
            return record
        step = int(record["step"])
        for name, value in record.items():
            if name != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                self.tb.add_scalar(tag_of(name), value, step)
        self.tb.flush()
        return record

    def close(self) -> None:
        self.metrics.close()
        if self.tb is not None:
            self.tb.close()


class Pace:
    """The figures a logged record lacks, measured where it is written: `step_time_s`
    (the wall time since the last step logged before, per step; none at the first),
    `tokens_per_s` (the record's `tokens` — the step's, over all ranks — per step time)
    and `memory_mib` (this process's peak, `peak_memory_mib`). A record's own win."""

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.last: tuple[int, float] | None = None  # the step logged last, and when
        self.step_time: float | None = None  # that step's

    def fill(self, record: dict[str, Any]) -> dict[str, Any]:
        step, now = int(record["step"]), time.perf_counter()
        if self.last is None or step < self.last[0]:
            self.step_time = None
        elif step > self.last[0]:
            self.step_time = (now - self.last[1]) / (step - self.last[0])
        if self.last is None or step != self.last[0]:  # (the same step again: as it was)
            self.last = (step, now)
        measured: dict[str, float] = {"memory_mib": peak_memory_mib(self.device)}
        if self.step_time is not None:
            measured["step_time_s"] = self.step_time
            tokens = record.get("tokens")
            if isinstance(tokens, (int, float)) and self.step_time > 0:
                measured["tokens_per_s"] = tokens / self.step_time
        return {**record, **{k: v for k, v in measured.items() if k not in record}}


def peak_memory_mib(device: Any = None) -> float:
    """This process's peak memory: the device's allocator on CUDA, else the resident set."""
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def drop_from(path: Path, step: int, say: Callable[[str], None] | None = None) -> bool:
    """Rewrite JSON-lines file `path` (metrics.jsonl, ft-steps.jsonl) without its records
    of `step` and later, atomically and never through a link; whether any record was kept
    (then the writer appends)."""
    if not path.is_file():
        return False
    kept = [r for r in read_metrics(path, warn=say)
            if isinstance(r.get("step"), int) and r["step"] < step]
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
    return bool(kept)


REDUCTIONS = ("mean", "sum", "max", "min")


def reduce_values(run, metrics: dict[str, Any], reduce: str | None) -> dict[str, float]:
    """`metrics` as floats, combined over `run`'s ranks by `reduce` (one all-reduce of
    them all; None: this rank's own)."""
    import torch

    if reduce is not None and reduce not in REDUCTIONS:
        raise UserError(f"run.log(reduce={reduce!r}): expected one of "
                        f"{', '.join(REDUCTIONS)} or None.")
    bad = [k for k, v in metrics.items() if not isinstance(v, (int, float, torch.Tensor))
           or (isinstance(v, torch.Tensor) and v.numel() != 1)]
    if bad:
        raise UserError(f"run.log: {', '.join(bad)} must be a number or a one-element "
                        "tensor.")
    if reduce is None or run.world_size == 1 or not metrics:
        # detached first: float() of a loss that requires grad warns (torch 2.13)
        return {k: float(v.detach() if isinstance(v, torch.Tensor) else v)
                for k, v in metrics.items()}
    import torch.distributed as dist

    t = torch.stack([torch.as_tensor(v, dtype=torch.float64).detach().reshape(())
                     .to(run.device) for v in metrics.values()])
    op = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}.get(reduce, dist.ReduceOp.SUM)
    dist.all_reduce(t, op=op)
    if reduce == "mean":
        t = t / run.world_size
    return dict(zip(metrics, t.tolist()))
