"""A tensor-parallel style torch does not ship: each rank of the tensor-parallel group
draws its own random numbers inside one module.

Phalanx seeds the ranks of a tensor-parallel group alike (from their data-parallel
rank), so dropout on activations every rank holds whole draws the same mask on each —
as it must, or the replicated activations would part. Inside a module whose work is
split by rank (attention over each rank's own heads) the masks must differ instead, as
they do between heads in one process. torch's DTensor RNG tracker does that for CUDA and
refuses a CPU mesh (torch 2.13); this style works on both: before the module runs it
draws one number from the shared stream (every rank of the group draws the same, so the
shared stream stays in step), forks torch's generators, and seeds them from that number
and the rank's place in the group; after the module, the shared stream is restored.
Activation checkpointing replays it (torch restores the generator before a recompute).
In evaluation, or when the module's `dropout` is 0, nothing random runs and nothing is
drawn or forked.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor.parallel.style import ParallelStyle


class ForkRNGByRank(ParallelStyle):
    """The module runs on its own random stream per tensor-parallel rank."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        rank = device_mesh.get_local_rank()
        held = ExitStack()  # (entered in the pre-hook, closed in the post-hook)

        def enter(module: nn.Module, args: tuple) -> None:
            if not module.training or getattr(module, "dropout", None) == 0:
                return  # (nothing random runs: no draw, no fork on the forward's path)
            base = int(torch.randint(0, 2 ** 62, (1,)).item())  # the same on every rank
            gpu = next((t.device for t in args if isinstance(t, torch.Tensor)
                        and t.device.type != "cpu"), None)
            held.enter_context(torch.random.fork_rng(
                devices=[gpu] if gpu is not None else [],
                device_type=gpu.type if gpu is not None else "cuda"))
            torch.manual_seed(base + rank)

        def leave(_module: nn.Module, _args: tuple, _output: Any) -> None:
            held.close()  # (nothing to close when `enter` forked nothing)

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
        return module
