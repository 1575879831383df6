"""The training libraries users write their loops with, as the linter sees them: which
public members of Hugging Face Accelerate's `Accelerator` and Lightning Fabric's `Fabric`
run a collective on every process (PX301 knows them, as it knows Phalanx's own `Run`),
which do only under a sharded or DeepSpeed launch (the script does not say which: never
an error), and which are local; their rank tests (`accelerator.is_main_process`,
`fabric.is_global_zero`, …: lint.syntax.RANK_NAMES) and their main-process decorators.
tests/unit/test_lint_libraries.py checks the tables against every public member of both
classes in the installed versions (the bench extra's), so a new version's member cannot
go unclassified silently."""

from __future__ import annotations

import ast

from phalanx.lint.syntax import dotted

# Accelerate (1.x): a collective on every process, whatever the launch
ACCELERATOR_COLLECTIVES = {
    "wait_for_everyone": "a barrier", "reduce": "an all-reduce", "gather": "an all-gather",
    "gather_for_metrics": "an all-gather", "pad_across_processes": "all-gathers the sizes",
    "main_process_first": "barriers: the main process first, then the others",
    "local_main_process_first": "barriers: each machine's main process first",
    "check_trigger": "an all-reduce of the trigger",
    "prepare": "wraps the model: DDP broadcasts the parameters, FSDP shards them",
    "prepare_model": "wraps the model: DDP broadcasts the parameters, FSDP shards them",
    "backward": "the backward of a wrapped model all-reduces the gradients",
}
# collectives only under FSDP or DeepSpeed (or tensor parallelism): not an error, since
# the launch configuration, not the script, decides
# (`save_state` waits for every process only with `automatic_checkpoint_naming=True`;
# otherwise it writes on the main process and each process's RNG state: checked against
# accelerate 1.15's source on diffusers' scripts, which call it under is_main_process)
ACCELERATOR_SHARDED = {"save_state", "get_state_dict", "save_model", "load_state",
                       "clip_grad_norm_",
                       "clip_grad_value_", "prepare_optimizer", "free_memory",
                       "unscale_gradients"}
ACCELERATOR_LOCAL = {
    "accumulate", "autocast", "clear", "context_parallel_rank",
    "data_parallel_rank", "data_parallel_shard_rank", "deepspeed_plugin",
    "deepspeed_ulysses_dl_adapter", "device", "dispatch_batches", "distributed_type",
    "end_training", "even_batches", "fp8_backend", "get_tracker",
    "gradient_accumulation_steps", "init_trackers", "is_composable_parallelism_enabled",
    "is_fsdp2", "is_last_process", "is_local_main_process", "is_main_process",
    "join_uneven_inputs", "local_process_index", "log", "logging_dir", "lomo_backward",
    "maybe_context_parallel", "mixed_precision", "multi_device", "no_sync",
    "non_blocking", "num_processes", "on_last_process", "on_local_main_process",
    "on_local_process", "on_main_process", "on_process", "optimizer_step_was_skipped",
    "parallelism_config", "pipeline_parallel_rank", "prepare_data_loader",
    "prepare_scheduler", "print", "process_index", "profile", "project_dir",
    "register_for_checkpointing", "register_load_state_pre_hook",
    "register_save_state_pre_hook", "save", "save_iteration", "set_trigger",
    "should_save_model", "skip_first_batches", "split_batches", "split_between_processes",
    "sync_gradients", "tensor_parallel_rank", "torch_device_mesh",
    "trigger_sync_in_backward", "unwrap_model", "use_distributed", "use_seedable_sampler",
    "use_stateful_dataloader", "verify_device_map"}

# Lightning Fabric (2.x)
FABRIC_COLLECTIVES = {
    "barrier": "a barrier", "all_reduce": "an all-reduce", "all_gather": "an all-gather",
    "broadcast": "a broadcast", "save": "saves, then a barrier", "load": "loads, then a barrier",
    "rank_zero_first": "barriers: global rank 0 first, then the others",
    "setup": "wraps the model: DDP broadcasts the parameters, FSDP shards them",
    "setup_module": "wraps the model: DDP broadcasts the parameters, FSDP shards them",
    "backward": "the backward of a wrapped model all-reduces the gradients",
    "launch": "starts the processes and joins the process group",
}
FABRIC_SHARDED = {"load_raw", "setup_optimizers", "clip_gradients"}
FABRIC_LOCAL = {
    "accelerator", "autocast", "call", "device", "global_rank", "init_module", "init_tensor",
    "is_global_zero", "local_rank", "log", "log_dict", "logger", "loggers",
    "no_backward_sync", "node_rank", "print", "run", "seed_everything",
    "setup_dataloaders", "sharded_model", "strategy", "to_device", "world_size"}

# their decorators that run the function on some processes only → the test it runs under
ON_PROCESS = {"on_main_process": "is_main_process",
              "on_local_main_process": "is_local_main_process",
              "on_last_process": "is_last_process",
              "on_process": "process_index == N", "on_local_process": "local_process_index == N"}

LIBRARIES = {"accelerate": ("Accelerator", ACCELERATOR_COLLECTIVES),
             "lightning": ("Fabric", FABRIC_COLLECTIVES),
             "lightning_fabric": ("Fabric", FABRIC_COLLECTIVES)}
CONVENTIONAL = {"Accelerator": ("accelerator",), "Fabric": ("fabric",)}


def library_receivers(ctx) -> dict[str, dict[str, str]]:
    """Names holding an `Accelerator` or a `Fabric` in a file that imports its library →
    that class's collectives: assigned from the class (`accelerator = Accelerator()`,
    `self.fabric = L.Fabric(...)`), and the libraries' own names for them (`accelerator`,
    `fabric`, `self.accelerator`, as their docs write them)."""
    memo = ctx.memo.setdefault("library_receivers", {})
    if "found" not in memo:
        memo["found"] = _receivers(ctx)
    return memo["found"]


def _receivers(ctx) -> dict[str, dict[str, str]]:
    classes = {}
    for origin in ctx.imported.values():
        root = origin.split(".")[0]
        if root in LIBRARIES:
            cls, table = LIBRARIES[root]
            classes[cls] = table
    if not classes:
        return {}
    found = {f"{pre}{name}": classes[cls] for cls in classes for name in CONVENTIONAL[cls]
             for pre in ("", "self.")}
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            cls = dotted(node.value).rsplit(".", 1)[-1]
            if cls in classes:
                found.update({dotted(t): classes[cls] for t in node.targets if dotted(t)})
    return found


def library_call(call: ast.Call, receivers: dict[str, dict[str, str]]) -> str | None:
    """"`accelerator.wait_for_everyone()` (a barrier)" for a library's collective."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    table = receivers.get(dotted(func.value))
    if table is None or func.attr not in table:
        return None
    return f"`{dotted(func)}()` ({table[func.attr]})"


def process_decorator(ctx, decorator: ast.expr) -> str | None:
    """The test `@accelerator.on_main_process` (and the like, `@accelerator.on_process(
    process_index=1)`) runs its function under: `accelerator.is_main_process`; None for
    any other decorator, and for `on_process` without its index as a constant."""
    receiver, _, method = dotted(decorator).rpartition(".")
    if method not in ON_PROCESS or receiver not in library_receivers(ctx):
        return None
    test = f"{receiver}.{ON_PROCESS[method]}"
    if "== N" not in test:
        return test
    index = next((k.value for k in getattr(decorator, "keywords", ())
                  if k.arg in ("process_index", "local_process_index")),
                 decorator.args[0] if isinstance(decorator, ast.Call) and decorator.args
                 else None)
    if not isinstance(index, ast.Constant) or not isinstance(index.value, int):
        return None
    return test.replace("N", str(index.value))
