"""Saving and loading checkpoints in a multi-rank script."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword


def _load_without_map_location(ctx: Context):
    if not ctx.distributed:
        return
    for call in ctx.calls_named("load"):
        if dotted(call) == "torch.load" and keyword(call, "map_location") is None:
            yield call, ""


def _load_without_weights_only(ctx: Context):
    for call in ctx.calls_named("load"):
        if dotted(call) == "torch.load":
            value = keyword(call, "weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                yield call, ""


def _wrapper_state_dict(ctx: Context):
    wrapped = ctx.assigned_from("DistributedDataParallel", "DDP")
    for call in ctx.calls_named("state_dict"):
        if isinstance(call.func, ast.Attribute) and dotted(call.func.value) in wrapped:
            yield call, f"(keys of `{dotted(call.func.value)}.state_dict()` start with `module.`)"


def _save_on_every_rank(ctx: Context):
    if not ctx.distributed:
        return
    for call in ctx.calls_named("save"):
        if dotted(call) == "torch.save" and ctx.rank_condition(call) is None:
            yield call, ""


RULES = [
    Rule("PX501", "warning", "torch.load without map_location in a multi-rank script: "
         "tensors saved from GPU 0 load onto GPU 0 on every rank.",
         "Pass `map_location=device` (or 'cpu').",
         "dist.init_process_group('nccl')\nstate = torch.load('ckpt.pt', weights_only=True)  # <-",
         "dist.init_process_group('nccl')\n"
         "state = torch.load('ckpt.pt', map_location=device, weights_only=True)",
         _load_without_map_location),
    Rule("PX502", "warning", "torch.load without weights_only=True can run arbitrary code from "
         "the file.", "Pass `weights_only=True` (and save tensors/plain containers only).",
         "state = torch.load('ckpt.pt', map_location='cpu')  # <-",
         "state = torch.load('ckpt.pt', map_location='cpu', weights_only=True)",
         _load_without_weights_only),
    Rule("PX503", "warning", "Saving the DDP wrapper's state_dict: every key gets a `module.` "
         "prefix and won't load into the plain model.",
         "Save `model.module.state_dict()`.",
         "model = DDP(net)\ntorch.save(model.state_dict(), 'm.pt')  # <-",
         "model = DDP(net)\ntorch.save(model.module.state_dict(), 'm.pt')", _wrapper_state_dict),
    Rule("PX504", "warning", "torch.save on every rank: N processes write the same file at "
         "once (a torn file).", "Save under `if rank == 0:` (or use a distributed checkpoint).",
         "dist.init_process_group('gloo')\ntorch.save(state, 'ckpt.pt')  # <-",
         "dist.init_process_group('gloo')\nif rank == 0:\n    torch.save(state, 'ckpt.pt')",
         _save_on_every_rank),
]
