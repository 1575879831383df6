"""FSDP2 (`torch.distributed.fsdp.fully_shard`): full sharding, ZeRO stage 3.

Each parameter becomes a DTensor sharded on dim 0 over the "dp" mesh: a rank stores 1/N
of the parameters, gradients and optimizer state. Before a block's forward (and again
for its backward, with `reshard_after_forward`) its parameters are all-gathered; after
backward its gradients are reduce-scattered. `--no-fsdp-reshard-after-forward` keeps the
gathered parameters from forward to backward (ZeRO-2-like: one all-gather fewer per
block, more memory).

Wrapping order (torchtitan's, and torch's documentation): activation checkpointing (the
model's own, MiniGPT's `--activation-checkpointing`) → compile (the trainer compiles the
wrapped root) → `fully_shard` on every block, then on the root, with the mixed-precision
policy given at wrap time. The optimizer must be built after this, on the sharded
parameters: `run.setup(model, factory)` does that.

This is FSDP2, not FSDP1: no `FullyShardedDataParallel` wrapper class, no
`auto_wrap_policy`, no `use_orig_params`, and `sharding_strategy` is expressed by where
`fully_shard` is called and `reshard_after_forward` (seed 003's FSDP1 advice is outdated).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, cast

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from phalanx.checkpoint import store
from phalanx.errors import UserError
from phalanx.strategies import pipeline, start, tensor_parallel
from phalanx.strategies.base import Alternative, BackwardSyncControl, Strategy
from phalanx.strategies.blocks import find_blocks, sharding_note
from phalanx.strategies.fsdp_output import check_outputs
from phalanx.strategies.guards import check_sharded
from phalanx.strategies.precision import Precision
from phalanx.strategies.tensors import uncompiled


class ShardedPrecision(Precision):
    """fp16 needs a scaler that agrees on inf/NaN across ranks' gradient shards."""

    def make_scaler(self):
        return _FusedSafeScaler(self.device.type)


class _FusedSafeScaler(ShardedGradScaler):
    """torch's ShardedGradScaler (it all-reduces the overflow flag), whose flag has the
    scalar shape a fused optimizer's step expects (torch 2.13 gives it shape [1], and a
    fused AdamW then fails with "output with shape [] doesn't match ... [1]")."""

    def unscale_(self, optimizer) -> None:
        super().unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        state["found_inf_per_device"] = {device: flag.reshape(()) for device, flag
                                         in state["found_inf_per_device"].items()}


class FSDPStrategy(Strategy, BackwardSyncControl):
    name = "fsdp"

    def precision(self, name: str) -> Precision:
        return ShardedPrecision(name, self.topology.device)

    def setup_module(self, model: nn.Module, precision: Precision,
                     blocks: list[nn.Module] | None = None, tp_plan: Any = None) -> nn.Module:
        """Rank 0's weights on every rank, then (with --tp) the tensor-parallel split
        (`tp_plan`: the script's, else the model's: `tensor_parallel.checked_plan`), then
        blocks first, then the root. A meta-device model is sharded first, then filled
        from rank 0's initialisation (`start`)."""
        if not any(p.requires_grad for p in model.parameters()):
            raise UserError(f"`--strategy fsdp` shards parameters, and this "
                            f"{type(model).__name__} has no trainable ones. Use `--strategy "
                            f"ddp` (or single), or give run.setup() the model to train.")
        meta = start.on_meta(model)
        tp_mesh, pp_mesh = self.topology.tp_mesh, self.topology.pp_mesh
        if pp_mesh is not None:
            pipeline.check_setup(model, pp_mesh.size(), meta, precision.name)
        full = start.full_weights_on_rank0(model, self.topology) if meta else None
        if not meta:
            model = start.place(model, self.topology)
            self.start_from_rank0(model)
        if pp_mesh is not None:  # (rank 0's weights everywhere: each keeps its stage's)
            pipeline.cut(model, pp_mesh)
            blocks = None if blocks is None else pipeline.kept(model, blocks)
        chosen = list(blocks) if blocks is not None else find_blocks(model)
        self.note = f"fsdp: {sharding_note(model, chosen)}"
        if pp_mesh is not None:
            self.note = f"{pipeline.stage_note(model, pp_mesh.size())}; {self.note}"
        if tp_mesh is not None:  # (rank 0's weights on every rank, or meta: filled below)
            model = tensor_parallel.split(model, tp_mesh, tp_plan)
        kwargs = self._shard_kwargs(precision)
        for block in chosen:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        if full is not None:
            start.empty(model, self.topology.device)
            start.load_full_weights(model, full, self.topology)
        check_outputs(model)  # (an output FSDP2 cannot hook: said at the first forward)
        return model

    def loss_context(self) -> AbstractContextManager:
        """With --tp: torch's `loss_parallel` (a model whose head keeps its logits split
        over the vocabulary — MiniGPT's plan — takes its cross-entropy, forward and
        backward, on the shards; plain tensors are not touched)."""
        if self.topology.tp_mesh is None:
            return nullcontext()
        return tensor_parallel.loss_context()

    def _shard_kwargs(self, precision: Precision) -> dict:
        o = self.options
        policy = MixedPrecisionPolicy()
        if precision.dtype is not None:  # gather low-precision params, reduce in fp32
            reduce = torch.bfloat16 if o.bf16_reduce else torch.float32
            policy = MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=reduce)
        kwargs = {"mesh": self.topology.dp_mesh, "reshard_after_forward": o.reshard_after_forward,
                  "mp_policy": policy}
        if o.cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        return kwargs

    def wrap(self, model: nn.Module) -> nn.Module:  # setup_module does the work
        return model

    def time_waits(self, model: nn.Module, waiting: Callable[[], AbstractContextManager]) -> None:
        """FSDP waits for each sharded module's all-gather in its pre-forward hook: timed
        from a hook before torch's to one after it."""
        for module in model.modules():
            if isinstance(module, FSDPModule):
                _time_unshard(module, waiting)

    def alternatives(self) -> list[Alternative]:
        """Not torch defaults (torch's are Phalanx's here): the alternatives users choose
        between."""
        o = self.options
        other = "last" if o.grad_sync == "every" else "every"
        keep = o.reshard_after_forward
        return [Alternative("FSDP gradient sync under accumulation", o.grad_sync,
                            f"{other} (alternative)", {"grad_sync": other}),
                Alternative("FSDP reshard_after_forward", str(keep),
                            f"{not keep} (alternative)", {"reshard_after_forward": not keep})]

    def unwrap(self, model: nn.Module) -> nn.Module:
        return uncompiled(model)

    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager:
        """grad_sync "every": reduce-scatter on every micro-step (gradients stay sharded);
        "last": skip until the last micro-step (full unsharded gradients are held)."""
        if not isinstance(model, FSDPModule):
            raise UserError("no_backward_sync() needs the module returned by run.setup(), "
                            f"got a plain {type(model).__name__}.")
        if self.options.grad_sync == "every" or not enabled:
            return nullcontext()
        return _no_gradient_sync(model)

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """The global norm over every rank's gradient shards (one all-reduce per mesh the
        gradients live on: two with tensor parallelism), then each rank scales its shards:
        the same number as DDP's, on every rank."""
        pp_mesh = self.topology.pp_mesh
        return tensor_parallel.clip(list(model.parameters()), max_norm,
                                    None if pp_mesh is None else pp_mesh.get_group())

    def save_state(self, model: nn.Module, optimizer) -> dict:
        """Every rank's own shards (DTensors): DCP writes each once, with their offsets."""
        return store.dcp_template(model, optimizer)[0]

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """All-gathered weights on rank 0, in CPU memory (a collective); with pipeline
        stages, each stage's gathered and sent to rank 0 (`pipeline.whole_state`)."""
        if self.topology.pp_mesh is not None:
            return pipeline.whole_state(model, self.topology)
        full = get_model_state_dict(model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        # (typed as any state-dict value by torch; a module's full state dict holds tensors)
        return cast(dict[str, torch.Tensor], full) if self.topology.is_main else {}

    def check_consistency(self, model: nn.Module) -> None:
        """Sharded parameters have one copy: each rank must hold the shard its placement
        says, and every rank the same layout; unsharded tensors (buffers) must agree, and
        under HSDP the replicas of each shard too."""

        t = self.topology
        if t.pp_mesh is not None:  # (each stage holds other parameters: not compared yet)
            raise UserError("run.check_consistency() under pipeline stages is not built in "
                            "this version (each stage holds its own parameters); leave it "
                            "out of a pipelined run.")
        check_sharded(model, t.device, t.world_size, t.rank, t.mesh)


def _time_unshard(module: nn.Module, waiting: Callable[[], AbstractContextManager]) -> None:
    held = ExitStack()  # (the wait spans two hooks: entered in one, closed in the other)

    @torch.compiler.disable  # (host timing: not traced under --compile)
    def enter(_module, _args) -> None:
        held.enter_context(waiting())

    @torch.compiler.disable
    def leave(_module, _args) -> None:
        held.close()

    module.register_forward_pre_hook(enter, prepend=True)  # before FSDP's own (prepended)
    module.register_forward_pre_hook(leave)


@contextmanager
def _no_gradient_sync(model: FSDPModule):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
