"""The strategy interface: everything that differs between ways of splitting a job.

A strategy is built from the job's `Topology` and its options (see `specs`), and owns:
placing and wrapping the module (`setup_module`, in one stated order), the optimizer it
needs (`setup_optimizer`), the precision policy and loss scaler (`precision`), gradient
clipping (`clip_grad_norm_`), the state it writes to and reads from checkpoints, the
full weights for export, unwrapping, and how ranks are compared. `Run` passes these
through; the built-in trainer calls only `Run`'s methods. Gradient accumulation needs
the `BackwardSyncControl` capability; a strategy that cannot skip synchronisation does
not implement it.

The defaults here are those of a replicated strategy (every rank holds the whole
model and optimizer state, as single and DDP do).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from phalanx.checkpoint import store
from phalanx.config.strategy import StrategySpec, spec
from phalanx.strategies import start, state_dict
from phalanx.strategies.guards import check_consistency
from phalanx.strategies.precision import Precision
from phalanx.strategies.topology import Topology


@dataclass(frozen=True)
class Alternative:
    """One of a strategy's settings beside the value users weigh it against (torch's
    default, or the other choice); `phalanx bench --defaults` times each."""

    setting: str  # what differs, e.g. "DDP static_graph"
    ours: str  # this strategy's value
    theirs: str  # the other value
    options: dict  # the strategy options that put `theirs` in place


class Strategy(ABC):
    """Wraps a model for one kind of parallelism.

    Args:
        topology: this process's place in the job (ranks, device, backend, mesh).
        options: the strategy's options dataclass (`specs`); None: its defaults.
    """

    name: str = ""
    note: str = ""  # what setup chose, said once on rank 0 (e.g. FSDP's blocks)

    def __init__(self, topology: Topology, options: Any = None) -> None:
        self.topology = topology
        self.options = options if options is not None else self.spec.options()
        self._share_plans: dict = {}  # how the last saved state was dealt out to ranks

    @property
    def spec(self) -> StrategySpec:
        return spec(self.name)

    @property
    def label(self) -> str:
        """The name, with the mesh's dimensions above 1 when it has several: "fsdp", "fsdp
        (dp_replicate 2 × dp_shard 2)" (HSDP), "fsdp (dp_shard 2 × tp 2)" — what banners,
        reports and checkpoints say."""
        mesh = self.topology.mesh
        if mesh is None or mesh.ndim < 2:
            return self.name
        names = mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)]
        shown = [f"{n} {s}" for n, s in zip(names, mesh.shape) if s > 1]
        return f"{self.name} ({' × '.join(shown)})" if shown else self.name

    @property
    def sharded(self) -> bool:
        """Whether parameters are split across ranks (no rank holds the whole model)."""
        return self.spec.sharded

    def check(self) -> None:
        """Refuse a world this strategy cannot run in (raise `UserError`)."""
        self.spec.check(self.options, self.topology.world_size,
                        self.topology.device.type == "cuda")

    def alternatives(self) -> list[Alternative]:
        """The settings of these options that differ from what users would otherwise get
        (torch's defaults), each with the options that undo it. Default: none."""
        return []

    # -- setup ------------------------------------------------------------------------
    def precision(self, name: str) -> Precision:
        """The autocast context and loss scaler for precision `name` (fp32/bf16/fp16)."""
        return Precision(name, self.topology.device)

    def setup_module(self, model: nn.Module, precision: Precision,
                     blocks: list[nn.Module] | None = None, tp_plan: Any = None) -> nn.Module:
        """Move to the device (a meta-device model: rank 0's initialisation, see `start`)
        → rank 0's weights on every rank → prepare (e.g. SyncBatchNorm) → wrap: the order
        the field guides prescribe. `blocks` (repeated submodules) matter to sharded
        strategies; `tp_plan` to tensor parallelism, which only FSDP's layouts take (with
        tp 1 there is nothing to split: it is not used)."""
        model = start.place(model, self.topology)
        self.start_from_rank0(model)
        return self.wrap(self.prepare(model))

    def loss_context(self) -> AbstractContextManager:
        """Around a micro-step's forward and backward (`Accumulator.micro_step`): what the
        loss needs. Default: nothing."""
        return nullcontext()

    def start_from_rank0(self, model: nn.Module) -> None:
        """Before wrapping: every rank holds rank 0's parameters and buffers (broadcast,
        then checked: `start.from_rank0`)."""
        start.from_rank0(model, self.topology)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Changes to the module before it is wrapped. Default: none."""
        return model

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module:
        """Wrap a module that already sits on the device.

        Args:
            model: the user's module, moved and prepared.
        """

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer training steps with (ZeRO wraps it). Default: as given."""
        return optimizer

    def time_waits(self, model: nn.Module, waiting: Callable[[], AbstractContextManager]) -> None:
        """Time this strategy's waits for the other ranks inside the forward of the
        wrapped `model` with `waiting` (the straggler check's, runtime.pace). Default:
        none (the gradient sync is in `acc.backward`, which times itself)."""
        return None

    def time_optimizer_waits(self, optimizer: torch.optim.Optimizer,
                             waiting: Callable[[], AbstractContextManager]) -> None:
        """Likewise inside `optimizer.step()` (ZeRO's broadcast), and an optimizer's own
        (one with a `phalanx_waiting` context to set: Muon's all-gathers under FSDP)."""
        if hasattr(optimizer, "phalanx_waiting"):
            optimizer.phalanx_waiting = waiting

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever `wrap` returned."""
        return getattr(model, "module", model)

    def local_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer holding this rank's state (ZeRO: its partition's). Default: itself."""
        return optimizer

    def release(self) -> None:  # noqa: B027 - an optional hook: most strategies hold nothing
        """Before the process group is destroyed: drop references to it. Default: none."""

    # -- the step -------------------------------------------------------------------------
    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Scale gradients so their global 2-norm is at most `max_norm`; return the norm
        before clipping (the same value on every rank)."""
        return torch.nn.utils.clip_grad_norm_(self.unwrap(model).parameters(), max_norm)

    # -- state ----------------------------------------------------------------------------
    def save_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
        """This rank's part of {"model": ..., "optim": ...} for DCP to write. Replicated:
        each tensor is dealt to one rank, so it is written once (see `share_of_replicated`)."""
        module = self.unwrap(model)
        if not state_dict.plain(module):  # e.g. compiled before setup: torch's names, all
            return store.dcp_template(model, optimizer)[0]  # ranks (DCP writes them once)
        state = state_dict.direct_state(module, optimizer)
        world = self.topology.world_size
        return state_dict.share_of_replicated(state, self.topology.rank, world,
                                              self._share_plans) if world > 1 \
            else state

    def load_template(self, model: nn.Module, optimizer: torch.optim.Optimizer | None
                      ) -> tuple[dict, dict]:
        """What this rank reads from a checkpoint: ({"model", "optim"}, optimizer state dict)."""
        return store.dcp_template(model, optimizer)

    def apply_state(self, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict, osd: dict) -> None:
        """Put what `load_template` read into the model and optimizer."""
        store.dcp_apply(model, optimizer, state, osd)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 ({} elsewhere). A collective for sharded
        strategies: call it on every rank."""
        if not self.topology.is_main:
            return {}
        return {k: v.detach() for k, v in self.unwrap(model).state_dict().items()}

    def check_consistency(self, model: nn.Module) -> None:
        """Raise `DistributedError` naming the first tensor that differs where ranks must
        agree (replicas: every parameter and buffer, bit for bit). A collective."""

        t = self.topology
        check_consistency(self.unwrap(model), t.device, t.world_size)


class BackwardSyncControl(ABC):
    """Capability: skip gradient synchronisation on accumulation micro-steps."""

    @abstractmethod
    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager:
        """Context in which backward does not synchronise gradients when `enabled`.

        Args:
            model: the wrapped module returned by `setup_module`.
            enabled: True on micro-steps that must not synchronise.
        """
