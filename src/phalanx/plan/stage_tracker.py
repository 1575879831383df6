"""torch's memory tracker for a pipelined step too (`phalanx plan --measure` under
`--pp`).

`MemTracker` keeps per-module records and refuses a root module entered a second time
in forward ("multiple iterative calls"): a pipeline stage's module runs once per
micro-batch inside one schedule step. `StageTracker` clears the per-module records
there — what `measure` already does between an accumulation window's micro-steps — and
keeps the tracker's peak, which is what the plan compares. A stage's receive buffers
(one per micro-batch, made at the first step and kept) are not created inside the
tracked step: `receive_buffers` finds them, for `track_external`.
"""

from __future__ import annotations

from typing import Any

from torch.distributed._tools.mem_tracker import MemTracker


class StageTracker(MemTracker):
    """MemTracker that takes a module's next forward in the same step (see the module
    doc); without pipeline stages it behaves as MemTracker."""

    def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
        tracker = self._mod_tracker
        if not tracker.is_bw and module in self.memory_tracking and \
                set(tracker.parents) - {tracker.get_known_fqn(module)} == {"Global"}:
            self.reset_mod_stats()  # the stage's next micro-batch
        super()._pre_fw_hook(module, inputs)


def receive_buffers(run: Any, model: Any) -> list:
    """The receive buffers of `model`'s pipeline stages on this rank, for activations and
    for gradients (none without pipeline stages)."""
    import torch

    found = []
    for pipeline in getattr(run, "_pipelines", {}).get(model, {}).values():
        for kind in ("args_recv_info", "grad_recv_info"):
            for infos in getattr(pipeline.stage, kind, {}).values():
                for info in infos if isinstance(infos, (tuple, list)) else [infos]:
                    buffer = getattr(info, "buffer", None)
                    if isinstance(buffer, torch.Tensor):
                        found.append(buffer)
    return found
