"""Step time: compute from FLOPs per token at a stated MFU, communication from the bytes
each strategy moves per step over a bus bandwidth, and what of it stays exposed.

Assumptions, stated in the output: backward is 2/3 of the compute and forward 1/3
(6·N = 2·N forward + 4·N backward); a collective that runs during a pass hides behind it
up to that pass's compute time (DDP's bucketed all-reduce during backward; FSDP's
prefetched all-gathers during forward and backward, its reduce-scatters during backward);
ZeRO's parameter broadcast after the optimizer step hides behind nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.config.strategy import spec
from phalanx.plan import formulas as f


@dataclass(frozen=True)
class StepTime:
    compute_s: float  # forward and backward
    comm_bytes: float  # sent per rank per optimizer step
    comm_s: float
    exposed_s: float
    optimizer_s: float = 0.0  # the optimizer step's own FLOPs (Muon's Newton–Schulz)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.optimizer_s + self.exposed_s


def comm_per_pass(strategy: str, reshard: bool, grad_bytes: int, param_bytes: int,
                  W: int, accum: int, muon_bytes: int = 0, syncs: int | None = None
                  ) -> dict[str, float]:
    """Bytes each rank sends per optimizer step, by the pass that can hide them; what
    moves follows from what the strategy shards (its spec's `shards`).

    Whole parameters on every rank (ddp/zero): ring all-reduce of the gradients once per
    optimizer step (the other micro-steps skip it): 2·(W−1)/W·G; with the optimizer state
    sharded (zero), each rank updates its share and broadcasts it: (W−1)/W·P. Sharded
    parameters (fsdp), per micro-step: all-gather (W−1)/W·P in forward, again in
    backward when parameters are resharded after forward, and reduce-scatter
    (W−1)/W·G in backward at each of the `syncs` gradient syncs (default: every
    micro-step; 1 under `--fsdp-grad-sync last`, which skips all but the last); with `--optimizer muon` each rank also all-gathers the
    hidden matrices' updates in the optimizer step, (W−1)/W·M (M = `muon_bytes`), which
    hides behind nothing.
    """
    if W == 1:
        return {"forward": 0.0, "backward": 0.0, "exposed": 0.0}
    shards = spec(strategy).shards
    if "parameters" not in shards:
        after = f.ring_all_gather_bytes(param_bytes, W) if "optimizer" in shards else 0.0
        return {"forward": 0.0, "backward": f.ring_all_reduce_bytes(grad_bytes, W),
                "exposed": after}
    gather = f.ring_all_gather_bytes(param_bytes, W)
    syncs = accum if syncs is None else syncs
    backward = accum * (gather if reshard else 0.0) + \
        syncs * f.ring_all_gather_bytes(grad_bytes, W)  # (a reduce-scatter's bytes)
    return {"forward": accum * gather, "backward": backward,
            "exposed": f.ring_all_gather_bytes(muon_bytes, W)}


def step_time(flops_per_token: int, tokens_per_rank: int, peak_flops: float, mfu: float,
              passes: dict[str, float], busbw: float, optimizer_flops: float = 0.0,
              seconds: dict[str, float] | None = None) -> StepTime:
    """compute = flops_per_token · tokens / (peak · MFU); the optimizer step's own FLOPs
    at the same rate, a term of their own (Muon's Newton–Schulz,
    `formulas.newton_schulz_flops`; AdamW's elementwise update: 0); each pass's
    communication (bytes / busbw, or the `seconds` given: links of two speeds) is exposed
    beyond that pass's compute (`formulas.exposed_seconds`)."""
    compute = f.compute_seconds(flops_per_token, tokens_per_rank, peak_flops, mfu)
    if seconds is None:
        seconds = {k: v / busbw for k, v in passes.items()}
    exposed = (f.exposed_seconds(seconds["forward"], compute / 3, 1.0) +
               f.exposed_seconds(seconds["backward"], 2 * compute / 3, 1.0) +
               seconds["exposed"])
    optimizer = f.compute_seconds(optimizer_flops, 1, peak_flops, mfu)
    return StepTime(compute, sum(passes.values()), sum(seconds.values()), exposed, optimizer)
