"""FSDP2 with its MixedPrecisionPolicy (bf16 parameters in compute, fp32 gradient
reduction, fp32 master weights) trains as DDP with bf16 autocast does, on one GPU.

What world size 1 proves: Phalanx's FSDP wrapping, policy and optimizer step run on CUDA
with NCCL, compute in bf16, keep fp32 weights and fp32 gradients, and reach the same
losses and weights as DDP within bf16 rounding. What it does not: sharding across ranks
(one rank holds every shard), the all-gather and reduce-scatter between GPUs, or an
fp32 reduction of several ranks' gradients — tests/dist proves those on CPU with gloo,
and a machine with 2+ GPUs is needed for them under NCCL.
"""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import scenario

pytestmark = pytest.mark.cuda

STEPS = 12  # by then it counts (loss < 0.1); later, Adam on near-zero gradients drifts
# per step, |Δloss| ≤ LOSS_RTOL·loss + LOSS_ATOL: bf16 keeps 8 bits of mantissa (a
# relative step of 2**-8), and FSDP's policy also runs the norms and the embedding in bf16.
# First H200 run (2026-11-27): within 1 % at every step but step 7, where Adam's loss
# spikes (1.96 → 3.75) and the two precisions part by 3.0 % (3.753 vs 3.640)
LOSS_RTOL, LOSS_ATOL = 5e-2, 2e-2
WEIGHT_RTOL = 3e-2  # ‖w_fsdp − w_ddp‖ / ‖w_ddp‖ after STEPS steps


def test_fsdp2_bf16_policy_matches_ddp(tmp_path, figure):
    runs = {}
    for strategy in ("ddp", "fsdp"):
        path = tmp_path / f"{strategy}.pt"
        runs[strategy] = scenario("strategy_steps", tmp_path, strategy=strategy,
                                  steps=STEPS, state_path=str(path))
        runs[strategy]["state"] = torch.load(path)
    ddp, fsdp = runs["ddp"], runs["fsdp"]
    assert (ddp["strategy"], fsdp["strategy"]) == ("ddp", "fsdp")
    # the policy: bf16 weights in the forward, fp32 master weights and gradients
    assert fsdp["forward_weight"] == "torch.bfloat16" and fsdp["param"] == "torch.float32"
    assert fsdp["grad"] == "torch.float32"
    assert ddp["forward_weight"] == "torch.float32"  # autocast casts inside each op
    pairs = list(zip(ddp["losses"], fsdp["losses"]))
    worst = max(abs(a - b) for a, b in pairs)
    figure("fsdp2 vs ddp losses, bf16, world size 1", ddp=ddp["losses"], fsdp=fsdp["losses"])
    off = [(i, a, b) for i, (a, b) in enumerate(pairs) if abs(a - b) > LOSS_RTOL * abs(a)
           + LOSS_ATOL]
    assert not off, f"steps where fsdp's loss is off ddp's (step, ddp, fsdp): {off}"
    assert ddp["losses"][-1] < ddp["losses"][0] - 1.0  # it learned to count
    assert ddp["state"].keys() == fsdp["state"].keys()
    num = sum((fsdp["state"][k] - v).norm() ** 2 for k, v in ddp["state"].items()) ** 0.5
    den = sum(v.norm() ** 2 for v in ddp["state"].values()) ** 0.5
    assert num / den < WEIGHT_RTOL
    figure("fsdp2 vs ddp, bf16, world size 1", steps=STEPS, worst_loss_abs=worst,
           weights_rel=float(num / den))
