"""A torchft run's result where any run leaves it: the group that finished the run has its
job-level outputs copied to the top of OUT (`OUT/model.safetensors`, `config.json`, the
report, …), so a user, `phalanx export`/`report` and any script written for a plain run
find them there. Each group's own details (its checkpoints, `ft-steps.jsonl`, logs) stay
in `OUT/replica-G/`.

Every replica group holds the same weights at every committed step (proven by the torchft
tests), so the finishing group's copy is the job's result; `OUT/ft-result.json` names the
group it came from."""

from __future__ import annotations

import json
import os
from pathlib import Path

from phalanx.paths import RunDir, atomic_write

# what a finished run leaves at its top that is the job's, not one group's
JOB_OUTPUTS = ("model.safetensors", "config.json", "tokenizer.json", "sample.txt",
               "loss.png", "metrics.jsonl", "events.jsonl", "run_config.json",
               "environment.json", "report.html")


def publish(out: Path, name: str) -> list[str]:
    """Copy replica group NAME's job-level outputs to the top of `out` (each replaced
    atomically; a link at the top is replaced, never followed; one the group does not
    have is removed from the top, so no earlier run's file passes for this one's), then
    record where they came from in `out/ft-result.json`. The names copied."""
    source = RunDir(out).replica(name)
    copied = []
    for file in JOB_OUTPUTS:
        src, dst = source / file, Path(out) / file
        if src.is_file() and not src.is_symlink():
            atomic_write(dst, src.read_bytes())
            copied.append(file)
        elif os.path.lexists(dst) and not dst.is_dir():
            dst.unlink()
    atomic_write(RunDir(out).ft_result, json.dumps(
        {"group": name, "from": f"replica-{name}", "files": copied}, indent=1) + "\n")
    return copied

