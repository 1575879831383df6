"""`phalanx plan [train options] [--world-size N] [--gpu NAME] [--json] [--measure]`:
per-rank memory and step time of ddp, zero and fsdp (with and without reshard-after-
forward) before launching; `--measure` runs a few steps of each on the local ranks and
prints predicted beside measured. `--model-states [--params N]`: the model states per
rank only — the ZeRO paper's table beside Phalanx's strategies (plan.model_states)."""

from __future__ import annotations

import argparse
import json
import sys

from phalanx.config.flags import TRAINING_RUN_ONLY, add_config_flags, count, resolve
from phalanx.config.layout import DIMS, given, requested, trainer_pipeline_refusal
from phalanx.errors import UserError
from phalanx.plan.devices import GPUS, busbw_from, device
from phalanx.plan.model_states import parse_count
from phalanx.plan.recommend import plan
from phalanx.plan.simulate import add_simulate_arguments, check_world, run_simulate

SUMMARY = ("Predict per-rank memory and step time of each strategy before launching "
           "(--measure: and check it on the local ranks).")
DEFAULT_MFU = 0.4
# nothing is read or written (the data, the run directory) or launched for long
NOT_PLANNED = TRAINING_RUN_ONLY + ("data.path", "data.cache_dir", "data.val_fraction",
                                   "train.out", "dist.max_restarts", "dist.nccl_preset",
                                   "dist.debug_collectives")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """plan's own flags first; then the training options that shape the planned step."""
    g = parser.add_argument_group("plan options")
    g.add_argument("--world-size", type=count(1, 1 << 20), default=None, metavar="N",
                   help="data-parallel ranks to plan for (default: --nproc-per-node × "
                        "--nnodes, or one per local GPU/core)")
    g.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"plan for this GPU: {', '.join(GPUS)} (default: this machine's "
                        f"CPU and RAM)")
    g.add_argument("--mfu", type=float, default=DEFAULT_MFU, metavar="X",
                   help=f"assumed model FLOPs utilisation (default: {DEFAULT_MFU})")
    g.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                   help="the device's dense peak in TFLOP/s (default: the GPU table's)")
    g.add_argument("--busbw-gbs", type=float, default=None, metavar="X",
                   help="all-reduce bus bandwidth in GB/s (default: the GPU table's)")
    g.add_argument("--inter-node-busbw-gbs", type=float, default=None, metavar="X",
                   help="bus bandwidth between machines, GB/s (with --nproc-per-node: "
                        "ranks per machine): each group's collectives are timed at its "
                        "slowest link, so HSDP's row (--dp-replicate/--dp-shard) shows "
                        "what keeping FSDP inside a machine saves")
    g.add_argument("--busbw-from", default=None, metavar="FILE",
                   help="read the bus bandwidth from `phalanx doctor --json` output")
    g.add_argument("--model-states", action="store_true",
                   help="print only the model states per rank (parameters, gradients, "
                        "optimizer state): the ZeRO paper's four stages beside Phalanx's "
                        "ddp/zero/fsdp, for --params and --world-size")
    g.add_argument("--params", type=parse_count, default=None, metavar="N",
                   help="with --model-states: the parameter count Ψ, e.g. 7.5e9, 7.5B or "
                        "124M (default: the planned model's)")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("--layouts", action="store_true",
                   help="also plan the HSDP and tensor-parallel layouts that fit machines of "
                        "--nproc-per-node ranks, and recommend among every row")
    g.add_argument("--measure", action="store_true",
                   help="run a few steps of each strategy on the local ranks and print "
                        "predicted beside measured")
    g.add_argument("--measure-steps", type=count(1, 100), default=2, metavar="N",
                   help="steps measured per strategy, after 3 warm-up steps (default: 2)")
    add_simulate_arguments(g)
    add_config_flags(parser, hide=NOT_PLANNED)


def planned_world(ns: argparse.Namespace, cfg) -> int:
    """`--world-size`; else --nproc-per-node × --nnodes; else one rank per local GPU/core."""
    if ns.world_size is not None:
        return ns.world_size
    if cfg.dist.nproc_per_node:
        return cfg.dist.nproc_per_node * cfg.dist.node_range()[1]
    from phalanx.launch.agent import default_nproc

    return default_nproc()


def run_plan(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.plan.tables import print_measured, print_plan

    cfg = resolve(ns)
    _check_modes(ns, cfg)
    W = planned_world(ns, cfg)
    extra = _candidates(ns, cfg, W)
    if ns.simulate:
        check_world(W, ns.simulate_rank)
    dev = device(ns.gpu)
    peak_flops = ns.peak_tflops * 1e12 if ns.peak_tflops else dev.peak_flops
    busbw = busbw_from(ns.busbw_from) if ns.busbw_from else \
        (ns.busbw_gbs * 1e9 if ns.busbw_gbs else dev.busbw)
    user = None
    if cfg.model.factory and not (ns.model_states and ns.params):
        from phalanx.plan.recommend import planned_vocab
        from phalanx.plan.user_model import load

        # `--model`: built on the meta device, traced on fake tensors at the planned
        # micro-batch and precision (phalanx.plan.user_model); checkpointing its blocks
        # is ready for the day the trainer does it (the config refuses it with --model)
        user = load(cfg.model.factory, cfg.model.block_size, vocab_size=planned_vocab(cfg)[0],
                    optimizer=cfg.train.optimizer, precision=cfg.train.precision,
                    micro_batch=cfg.train.micro_batch_size,
                    checkpointed=cfg.model.activation_checkpointing)
    if ns.model_states:
        return print_model_states(ns, cfg, W, user)
    inter = _inter_node(ns, cfg, W)
    result = plan(cfg, W, dev, ns.mfu, peak_flops, busbw, user, extra, inter)
    if ns.measure:
        from phalanx.plan.compare import measure_locally

        if cfg.model.factory:
            check_trainable(cfg)

        result["measured"] = measure_locally(cfg, W, ns.measure_steps, result["rows"],
                                             extra)

    if ns.json:
        if ns.simulate:  # stored in the result, printed with it
            run_simulate(ns, cfg, W, result, extra)
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print_plan(result)
    if ns.measure:
        print_measured(result)
    if ns.simulate:
        run_simulate(ns, cfg, W, result, extra)
    return 0


def _check_modes(ns: argparse.Namespace, cfg) -> None:
    """The flags that do not go together, each refused in one line."""
    check_pipeline(cfg, "--simulate" if ns.simulate else
                   "--model-states" if ns.model_states else None)
    if ns.model_states and (ns.measure or ns.simulate):
        raise UserError("`--model-states` prints the model states' arithmetic only; "
                        "`--measure` and `--simulate` check the full plan: leave out "
                        "`--model-states` to run them.")
    if ns.params is not None and not ns.model_states:
        raise UserError(f"`--params {ns.params:g}` sets Ψ for `--model-states`; add "
                        f"`--model-states`, or leave `--params` out to plan the model the "
                        f"flags describe.")
    if not 0 < ns.mfu <= 1:
        raise UserError(f"`--mfu {ns.mfu}` must be in (0, 1], e.g. 0.4.")


def _inter_node(ns: argparse.Namespace, cfg, W: int) -> float | None:
    """`--inter-node-busbw-gbs` in bytes/s, checked: it needs machines to be between."""
    if ns.inter_node_busbw_gbs is None:
        return None
    if not ns.inter_node_busbw_gbs > 0:
        raise UserError(f"`--inter-node-busbw-gbs {ns.inter_node_busbw_gbs:g}` must be "
                        f"positive, e.g. 50 (400 Gb/s InfiniBand per GPU).")
    per_machine = cfg.dist.nproc_per_node
    if not per_machine or per_machine >= W:
        raise UserError(f"`--inter-node-busbw-gbs` times the links between machines, and "
                        f"this plan has one machine ({W} ranks, --nproc-per-node "
                        f"{per_machine or 'not given'}): give --nproc-per-node below the "
                        f"world size (e.g. `--nproc-per-node 8 --world-size 32`).")
    return ns.inter_node_busbw_gbs * 1e9


def _candidates(ns: argparse.Namespace, cfg, W: int) -> tuple:
    """The rows beside the 1-D ones: the layout the flags ask for (`layout_rows`); with
    `--layouts`, the candidate meshes for W ranks on machines of --nproc-per-node instead
    (layout flags refused beside it)."""
    from phalanx.plan.layouts import candidates

    named = given(requested(cfg.dist))  # (layout_rows takes the flags off the config)
    asked = layout_rows(cfg, W)
    if not ns.layouts:
        return asked
    if named or ns.measure or ns.simulate or ns.model_states:
        said = "layout flags" if named else "--measure" if ns.measure else \
            "--simulate" if ns.simulate else "--model-states"
        raise UserError(f"`--layouts` plans the candidate layouts itself; leave out {said} "
                        f"(or leave out --layouts to plan the layout you name).")
    from phalanx.plan.layouts import pipeline_candidates
    from phalanx.strategies.pipeline import drops_outputs

    per_machine = cfg.dist.nproc_per_node or W
    return candidates(cfg, W, per_machine) + pipeline_candidates(
        cfg, W, per_machine, keeps_outputs=not drops_outputs())


def layout_rows(cfg, W: int) -> tuple:
    """The row of the mesh the layout flags ask for — HSDP's `--dp-replicate R --dp-shard
    S`, tensor parallelism's `--tp T` inside either (checked as `phalanx train` checks
    them, for W ranks); none without layout flags or for a layout that is a 1-D row (fsdp
    or ddp over the world). The config is left with the strategy the flags chose and
    without the flags (the other rows are the strategies over the whole world; that
    strategy's options, e.g. --fsdp-bf16-reduce, stay valid when it is checked again)."""
    from phalanx.config.strategy import choose
    from phalanx.plan.estimate import mesh_variant, pipeline_variant
    from phalanx.plan.tensor_parallel import tp_refusal

    if not given(requested(cfg.dist)):
        return ()
    choice = choose(cfg.dist, W, cfg.train.grad_accum)
    layout = choice.layout
    if layout.tp > 1 and (why := tp_refusal(cfg)):
        raise UserError(f"`--tp {layout.tp}`: `phalanx plan` models tensor parallelism for "
                        f"MiniGPT in fp32, and {why}. Leave it out to plan the "
                        f"layout (or leave --tp out to plan the data-parallel ones).")
    for dim in DIMS:
        setattr(cfg.dist, dim, None)
    cfg.dist.strategy = choice.name
    reshard = cfg.dist.fsdp_reshard_after_forward
    if layout.pp > 1:
        from phalanx.strategies.pipeline import drops_outputs

        return (pipeline_variant(layout.pp, cfg.dist.pp_schedule, layout.dp_replicate,
                                 layout.dp_shard, reshard=reshard,
                                 keeps_outputs=not drops_outputs()),)
    if not (layout.hybrid or layout.tp > 1):
        return ()
    return (mesh_variant(layout.dp_replicate, layout.dp_shard, layout.tp, reshard=reshard),)


def check_pipeline(cfg, mode: str | None = None) -> None:
    """`--pp P`: what `phalanx train` refuses under pipeline stages, and what the planner
    does not model there yet (plan.pipeline: MiniGPT, FSDP2 inside each stage; not on
    `--simulate`'s fake world nor in `--model-states`' table: `mode`), in one line before
    anything is planned."""
    pp = cfg.dist.pp
    if not isinstance(pp, int) or pp < 2:
        return
    if mode is not None:
        what = {"--simulate": "does not run pipeline stages yet (their sends and receives "
                              "on the fake world); `--measure` checks the `--pp` row on "
                              "the local ranks",
                "--model-states": "is the data-parallel regimes' arithmetic (no pipeline "
                                  "stages)"}[mode]
        raise UserError(f"`{mode}` {what}: leave `{mode}` or `--pp {pp}` out.")
    from phalanx.plan.pipeline import unplanned

    refusal = trainer_pipeline_refusal(cfg)
    found = unplanned(cfg)
    if refusal is None and found:
        refusal = (f"{found} is not planned under pipeline stages yet (the plan models "
                   f"MiniGPT with FSDP2 inside each stage); leave it out")
    if refusal is not None:
        raise UserError(f"`--pp {pp}`: {refusal}.")


def print_model_states(ns: argparse.Namespace, cfg, W: int, user) -> int:
    """`--model-states`: the ZeRO paper's table and Phalanx's regimes (plan.model_states)
    for `--params` (or the planned model's count, and its share of Muon-stepped
    parameters with `--optimizer muon`)."""
    from phalanx.plan import formulas as f
    from phalanx.plan.model_states import print_table, table
    from phalanx.plan.recommend import facts_for

    share = 1.0
    if ns.params:
        n = ns.params
    else:
        shapes, copies = (user.shapes, list(user.copies)) if user else \
            (facts_for(cfg).param_shapes, facts_for(cfg).copies())  # no trace needed
        n = sum(map(f.numel, shapes))
        share = sum(f.numel(p) for p, c in zip(shapes, copies) if c == f.MUON_COPIES) / n
    result = table(n, W, cfg.train.optimizer, share)
    if ns.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_table(result)
    return 0


def check_trainable(cfg) -> None:
    """`--measure` trains the model as `phalanx train` does, on token ids: a factory whose
    module cannot take them (its example is something else) is one line here, before any
    rank starts."""
    from phalanx.models.user import check_user_model
    from phalanx.plan.recommend import planned_vocab

    try:
        check_user_model(cfg.model.factory, planned_vocab(cfg)[0], cfg.model.block_size)
    except UserError as exc:
        raise UserError(f"`--measure` trains your model as `phalanx train` does, on "
                        f"(micro-batch, block size) token ids, and it can't: {exc}") from None
