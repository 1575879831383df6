"""The files a finished `phalanx train` run leaves at the top of its run directory, asked
by the launcher before anything is launched (so it imports no torch module of its own)."""

from __future__ import annotations

import os

from phalanx.config.sections import Config
from phalanx.paths import RunDir


def missing_outputs(cfg: Config, out: RunDir) -> list[str]:
    """The files `train.finish` leaves in `out` that are not there (a run stopped while it
    wrote them): a complete run whose list is not empty writes them again."""
    out = RunDir(out)
    paths = [out.model, out.model_config, out.loss_plot, out.report]
    if cfg.train.sample_tokens > 0:
        paths.append(out.sample)
    # (exists: a `report.html` that is a directory was warned about, not rewritten forever)
    return [path.name for path in paths if not os.path.lexists(path)]
