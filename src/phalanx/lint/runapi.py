"""Phalanx's own `Run` as the linter sees it: which of its public methods run a
collective on every rank (PX301 knows them), which are local, and which names hold a
`Run` in a file."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, dotted, keyword

__all__ = ["RUN_COLLECTIVES", "RUN_LOCAL", "run_call", "run_receivers"]

# Phalanx's own `Run` (phalanx.runtime.run): every public method that runs a collective on
# all ranks, and what it runs (tests/unit/test_lint_patterns_a.py keeps this complete).
RUN_COLLECTIVES = {
    "setup": "wraps the model: DDP broadcasts the parameters, FSDP shards them",
    "full_state_dict": "gathers the whole model's weights",
    "export": "gathers the weights, then broadcasts rank 0's outcome",
    "all_reduce": "an all-reduce", "all_reduce_mean": "an all-reduce",
    "all_reduce_sum": "an all-reduce", "agree": "an all-reduce", "barrier": "a barrier",
    "log": "all-reduces the metrics", "broadcast": "a broadcast",
    "gather_objects": "an all-gather", "check_consistency": "compares every rank's replica",
    "stop_requested": "all-reduces the stop flag", "close": "a barrier, then destroys the group",
    "save": "a distributed checkpoint: every rank writes its part",
    "resume": "finds and loads a checkpoint: broadcast and collectives",
    "load": "loads a distributed checkpoint: collectives",
    "latest_checkpoint": "broadcasts rank 0's answer",
    "wait_checkpoint": "commits the background save: collectives",
    "clip_grad_norm_": "all-reduces the gradient norm",
    "forward_backward": "syncs the gradients in its backward (under pipeline stages: the "
                        "schedule's sends and receives, and an all-reduce of the loss)",
    "eval_loss": "a sharded model's forward gathers (under pipeline stages: the schedule's "
                 "sends and receives, and an all-reduce of the loss)",
    "step": "steps the optimizer (ZeRO broadcasts the updated shards); every "
            "--straggler-every steps, an all-reduce of the ranks' pace",
    "step_ended": "every --straggler-every steps, an all-reduce of the ranks' pace",
    "load_pretrained": "loads a Hugging Face checkpoint through DCP: collectives",
    "profile": "gathers every rank's profile figures when the block ends",
}
# Its public methods that run no collective (local to the rank).
RUN_LOCAL = {"unwrap", "loader", "accumulate", "seed_step", "at_step", "end_log",
             "diagnose_devices",
             "watch", "beat", "catch_stop_signals", "say_once", "print", "checkpoint_staged",
             "poll_checkpoint", "stop_signal_here", "waiting"}


def run_receivers(ctx: Context) -> set[str]:
    """Names holding Phalanx's `Run`: assigned (or `with ... as`) from `phalanx.init(...)`
    or an `init` imported from phalanx; and `run` in a file that imports phalanx. (Found
    once per file: several analyses ask.)"""
    cache = ctx.memo.setdefault("run_receivers", {})
    if "found" not in cache:
        cache["found"] = _receivers(ctx)
    return cache["found"]


def _receivers(ctx: Context) -> set[str]:
    found = {"run"} if any(o == "phalanx" or o.startswith("phalanx.")
                           for o in ctx.imported.values()) else set()
    for node in ctx.of(ast.Assign):
        if _is_init(ctx, node.value):
            found |= {dotted(t) for t in node.targets}
    for item in ctx.of(ast.withitem):
        if item.optional_vars is not None and _is_init(ctx, item.context_expr):
            found.add(dotted(item.optional_vars))
    return found - {""}


def _is_init(ctx: Context, value: ast.AST) -> bool:
    if not isinstance(value, ast.Call):
        return False
    name = dotted(value)
    return name == "phalanx.init" or (name == "init" and ctx.imported.get("init", "")
                                       .startswith("phalanx"))


def run_call(call: ast.Call, runs: set[str]) -> str | None:
    """"`run.log()` (all-reduces the metrics)" for a collective of Phalanx's `Run`."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in RUN_COLLECTIVES
            and dotted(func.value) in runs):
        return None
    reduce = keyword(call, "reduce")
    if func.attr == "log" and isinstance(reduce, ast.Constant) and reduce.value is None:
        return None  # rank 0's own values, no collective
    return f"`{dotted(func)}()` ({RUN_COLLECTIVES[func.attr]})"
