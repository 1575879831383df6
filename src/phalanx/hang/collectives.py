"""Which collective a rank waits in, named by what the user called: read from the torch
frames of its stack (FSDP2's `fully_shard` hooks, FSDP1, DDP, ZeroRedundancyOptimizer,
DCP, DTensor, SyncBatchNorm), with the phase (forward/backward) and the module the forward runs.

Measured on torch 2.13 (gloo, CPU): a blocked collective shows Python frames down to the
torch function that waits (`all_gather_single` in distributed_c10d.py, called from
`_fsdp_collectives.py`); on CPU autograd runs backward hooks on the calling thread, so
FSDP's post-backward reduce-scatter sits above `_engine_run_backward` in the main
thread's stack, while DDP's gradient all-reduce (its C++ Reducer) shows no frame at all.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from dataclasses import dataclass

from phalanx.lint.rules.collectives import COLLECTIVES

_TORCH = os.sep + "torch" + os.sep
# torch.distributed functions that wait, beyond the ones `phalanx lint` knows by name
# (and point-to-point: a blocking send/recv waits for its peer as a collective does)
OPS = frozenset(COLLECTIVES) | {"all_gather_single", "reduce_scatter_single",
                                "_broadcast_coalesced", "all_gather_tensor", "send", "recv"}
_BACKWARD = {"_engine_run_backward", "run_backward", "pre_backward", "_pre_backward",
             "post_backward", "_post_backward_hook", "_pre_backward_hook", "_reduce_grad",
             "_reduce_grad_no_shard"}
_FORWARD = {"_pre_forward", "pre_forward", "_pre_forward_unshard", "forward",
            "_wrapped_call_impl"}


@dataclass(frozen=True)
class Rule:
    """Frames in a torch file whose path contains `path`, in one of `functions` (any
    function when empty): the rank is in `label` (`{op}`: the waiting function)."""

    path: str
    functions: frozenset[str]
    label: str
    phased: bool = False  # say "in the forward"/"in the backward"
    code: str = ""  # and the frame's source line contains this


def _rule(path: str, functions: str, label: str, phased: bool = False, code: str = "") -> Rule:
    return Rule(path.replace("/", os.sep), frozenset(functions.split()), label, phased, code)


# the families of wrappers, each with the path its torch files share; within one, the
# first rule that matches wins (the most specific first)
FAMILIES = {
    "fsdp2": ("fsdp/_fully_shard/", (
        _rule("fsdp/_fully_shard/", "foreach_reduce post_backward", "FSDP reduce-scatter",
              True),
        _rule("fsdp/_fully_shard/", "foreach_all_gather unshard wait_for_unshard",
              "FSDP all-gather", True),
        _rule("fsdp/_fully_shard/", "", "FSDP (fully_shard) {op}", True))),
    "fsdp1": ("fsdp/", (
        _rule("fsdp/_runtime_utils.py", "_reduce_grad _reduce_grad_no_shard "
              "_post_backward_hook", "FSDP reduce-scatter", True),
        _rule("fsdp/_flat_param.py", "_all_gather_flat_param unshard", "FSDP all-gather",
              True),
        _rule("fsdp/_runtime_utils.py", "_unshard _pre_forward_unshard", "FSDP all-gather",
              True),
        _rule("fsdp/_state_dict_utils.py", "", "FSDP's state-dict gather ({op})"),
        _rule("fsdp/_optim_utils.py", "", "FSDP's optimizer-state gather ({op})"),
        _rule("fsdp/", "", "FSDP {op}", True))),
    "ddp": ("nn/parallel/distributed.py", (
        _rule("nn/parallel/distributed.py", "_sync_buffers _sync_module_buffers "
              "_check_sync_bufs_pre_fwd _distributed_broadcast_coalesced",
              "DDP buffer broadcast in the forward"),
        _rule("nn/parallel/distributed.py", "__init__ _sync_params_and_buffers "
              "_verify_param_shape_across_processes",
              "DDP's construction (parameter broadcast)"),
        _rule("nn/parallel/distributed.py", "_pre_forward",
              "DDP bucket rebuild (broadcast)",
              True, code="_rebuild_buckets"),
        _rule("nn/parallel/distributed.py", "", "DDP's sync ({op})", True))),
    "zero": ("zero_redundancy_optimizer.py", (
        _rule("zero_redundancy_optimizer.py", "consolidate_state_dict",
              "ZeroRedundancyOptimizer.consolidate_state_dict's broadcast of optimizer "
              "state"),
        _rule("zero_redundancy_optimizer.py", "step _sync_params",
              "ZeroRedundancyOptimizer.step's parameter broadcast"),
        _rule("zero_redundancy_optimizer.py", "", "ZeroRedundancyOptimizer {op}"))),
    "dcp": ("distributed/checkpoint/", (
        _rule("distributed/checkpoint/state_dict_saver.py", "", "DCP save ({op})"),
        _rule("distributed/checkpoint/state_dict_loader.py", "", "DCP load ({op})"),
        _rule("distributed/checkpoint/state_dict.py", "", "DCP state-dict gather ({op})"),
        _rule("distributed/checkpoint/", "", "DCP {op}"))),
    "syncbn": ("nn/modules/_functions.py", (
        _rule("nn/modules/_functions.py", "forward backward",
              "SyncBatchNorm's all-gather of batch statistics", True),)),
    "pipelining": ("distributed/pipelining/", (
        _rule("distributed/pipelining/", "_wait_batch_p2p",
              "the pipeline schedule's send/recv between stages"),
        _rule("distributed/pipelining/", "", "the pipeline schedule's {op}"))),
    "functional": ("distributed/_functional_collectives.py", (
        _rule("distributed/_functional_collectives.py", "wait_tensor",
              "tensor parallelism's collective (a DTensor layer's output all-reduced or "
              "gathered, waited on where it is used)", True),)),
    "dtensor": ("distributed/tensor/", (
        _rule("distributed/tensor/", "full_tensor", "DTensor full_tensor's all-gather"),
        _rule("distributed/tensor/", "redistribute", "DTensor redistribute ({op})"),
        _rule("distributed/tensor/", "", "DTensor {op}"))),
}


def _matches(rule: Rule, frame) -> bool:
    return rule.path in frame.file and rule.code in frame.code and \
        (not rule.functions or frame.function in rule.functions)


def _rules(torch_frames) -> list[Rule]:
    """The rules to try, in order: the specific ones of the wrappers on the stack from the
    outermost in (what the user called: a DCP save of an FSDP model is a DCP save; DDP's
    forward running SyncBatchNorm's all-gather is SyncBatchNorm's), then their catch-alls
    (a rule for any function of the family's whole path)."""
    present: list[tuple[str, tuple[Rule, ...]]] = []
    for frame in torch_frames:
        for path, rules in FAMILIES.values():
            if path.replace("/", os.sep) in frame.file and (path, rules) not in present:
                present.append((path, rules))
                break

    def generic(path: str, rule: Rule) -> bool:
        return rule.path == path.replace("/", os.sep) and not rule.functions and not rule.code

    return [r for p, rules in present for r in rules if not generic(p, r)] + \
        [r for p, rules in present for r in rules if generic(p, r)]


def phase(stack) -> str | None:
    """"backward" when the rank runs autograd's backward (or an FSDP backward hook),
    "forward" when it is in a module's forward, else None."""
    names = {f.function for f in stack if _TORCH in f.file}
    if names & _BACKWARD:
        return "backward"
    return "forward" if names & _FORWARD else None


def waiting_op(stack) -> str | None:
    """The innermost torch.distributed function that waits (all_reduce, ...)."""
    for frame in reversed(stack):
        if _TORCH in frame.file and "distributed" in frame.file and frame.function in OPS:
            return frame.function
    return None


def name_collective(stack, wrappers: frozenset[str] | None = None) -> str | None:
    """What the rank waits in, e.g. "FSDP all-gather in the forward", "all_reduce",
    "DDP gradient all-reduce in the backward"; None outside any collective. `wrappers`:
    the torch wrapper classes alive in the rank's process (None: not known)."""
    op = waiting_op(stack)
    torch_frames = [f for f in stack if _TORCH in f.file]
    for rule in _rules(torch_frames):
        if any(_matches(rule, f) for f in torch_frames):
            label = rule.label.format(op=op) if op else \
                rule.label.replace(" ({op})", "").replace("{op}", "collective")
            where = phase(stack) if rule.phased else None
            label = f"{label} in the {where}" if where else label
            return label + _p2p_direction(stack) if "pipeline" in label else label
    if op is not None:
        return op
    return _backward_without_frames(torch_frames, wrappers)


_DIRECTIONS = {"fwd_recv": "receiving activations from the previous stage",
               "fwd_send": "sending activations to the next stage",
               "bwd_recv": "receiving gradients from the next stage",
               "bwd_send": "sending gradients to the previous stage"}
_DESC = re.compile(r'desc="([a-z_]+)"')
_SENDS = {"fwd_sends_to_wait": "fwd_send", "bwd_sends_to_wait": "bwd_send"}


def _p2p_direction(stack) -> str:
    """" (sending activations to the next stage)", read from torch's schedule source at
    the wait the rank is in: the `desc=` torch gives that batch of sends and receives (on
    the line, or on the lines just above that made it), or the list of sends a loop waits
    on; " (sending to a neighbouring stage)" for a send kept from an earlier turn; "" when
    the source says nothing."""
    frame = next((f for f in reversed(stack)
                  if "pipelining" in f.file and "_wait_batch_p2p(" in f.code), None)
    if frame is None:
        return ""
    lines = [linecache.getline(frame.file, n) for n in range(max(1, frame.line - 3),
                                                               frame.line)]
    if "send_work" in frame.code:
        return " (sending to a neighbouring stage)"
    found = _DESC.findall(frame.code) or \
        [d for line in lines for key, d in _SENDS.items() if f"in {key}" in line] or \
        [d for line in lines for d in _DESC.findall(line)]
    if not found:
        return ""
    parts = [_DIRECTIONS[p] for p in re.findall(r"(?:fwd|bwd)_(?:send|recv)", found[-1])
             if p in _DIRECTIONS]
    return f" ({' and '.join(parts)})" if parts else ""


def _backward_without_frames(torch_frames, wrappers) -> str | None:
    """The main thread in autograd's engine with no collective visible in Python: DDP's
    C++ Reducer all-reduces gradients there (or, on a GPU, FSDP's hooks on autograd's
    device thread)."""
    if any(f.function in ("_engine_run_backward", "run_backward") for f in torch_frames):
        if wrappers is None:
            return "backward (DDP all-reduces gradients in it)"
        if "DistributedDataParallel" in wrappers:
            return "DDP gradient all-reduce in the backward"
        kinds = sorted(wrappers)
        return "the backward (autograd" + (f"; {', '.join(kinds)} in use" if kinds else "") \
            + "; no collective visible in Python)"
    return None


_NOT_MODULES = {"torch", "F", "nn", "dist", "np", "math", "print", "len", "range", "sum",
                "float", "int", "list", "tuple", "dict", "enumerate", "zip", "isinstance",
                "min", "max", "super", "type"}
_METHODS = {"sum", "mean", "item", "backward", "step", "zero_grad", "to", "cuda", "cpu",
            "detach", "float", "view", "reshape", "size", "append", "format", "no_grad",
            "inference_mode", "eval", "train", "numel", "squeeze", "unsqueeze"}


def module_called(code: str) -> str | None:
    """The module a source line calls, e.g. `model` in `loss = model(x).sum()` or
    `self.encoder` in `h = self.encoder(x)`; None when not exactly one call looks like a
    module call."""
    try:
        tree = ast.parse(code.strip().rstrip(":\\").removeprefix("return ")
                         .removeprefix("with "))
    except SyntaxError:
        return None
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name and name.split(".")[0] not in _NOT_MODULES \
                and name.split(".")[-1] not in _METHODS:
            found.append(name)
    return found[0] if len(set(found)) == 1 else None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None
