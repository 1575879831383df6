"""What each strategy is, without torch: its name, its options, its pre-launch checks.

The registry (`SPECS`) is the only place that knows the strategies by name. Config
validation (before any worker starts) and the strategy itself (inside a worker) read the
same spec: the same options dataclass, filled from the same flags, and the same `check`.

A job's strategy is decided once, by `choose` (from the config) or `choose_for_script`
(from `phalanx.init(strategy=..., **options)`), into a `StrategyChoice`: the spec, the
options it is built with and the world size it was decided for. `phalanx.init` builds
the strategy from that value; nothing decides again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from phalanx.config.fields import flag_of
from phalanx.config.layout import DIMS, REST, Layout, fill, given, requested, said
from phalanx.errors import UserError


@dataclass(kw_only=True)
class NoOptions:
    """`single` has nothing to tune."""


@dataclass(kw_only=True)
class DDPOptions:
    bucket_cap_mb: float | None = 25.0  # None: torch's default (25 MiB, first bucket 1 MiB)
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    find_unused_parameters: bool = False
    sync_batchnorm: bool = False
    process_group: Any = None  # a subgroup to replicate over (bench --scaling); None: all


@dataclass(kw_only=True)
class ZeroOptions(DDPOptions):
    """ZeRO-1 = DDP's gradient all-reduce + a ZeroRedundancyOptimizer; DDP's options apply."""


@dataclass(kw_only=True)
class FSDPOptions:
    reshard_after_forward: bool = True
    bf16_reduce: bool = False
    cpu_offload: bool = False
    grad_sync: str = "every"  # "every": reduce-scatter each micro-step; "last": only the last


@dataclass(frozen=True)
class StrategySpec:
    """One strategy: `impl` ("module:Class") is imported only inside a worker."""

    name: str
    summary: str
    impl: str
    options: type
    # what one rank holds 1/N of, of "parameters", "gradients", "optimizer" (the state);
    # the rest every rank holds whole (the planner's memory and traffic model reads it)
    shards: frozenset[str] = frozenset()
    flag_prefix: str = ""  # config field of option `x` is `flag_prefix + x`
    checks: tuple[Callable[[Any, int, bool], None], ...] = field(default=())
    # the options as a training run uses them, given its accumulation (None: as given)
    settle: Callable[[Any, int], Any] | None = None
    # the layout dimensions it spans (config.layout), its own first: it takes the rest of
    # the world unless a size is -1; any other dimension above 1 is refused with `hint`
    dims: tuple[str, ...] = ()
    hint: str = ""
    takes_layout: bool = True  # False: any layout flag is refused (zero: no mesh at all)

    @property
    def sharded(self) -> bool:
        """Whether parameters are split across ranks (no rank holds the whole model)."""
        return "parameters" in self.shards

    def make_options(self, **given: Any) -> Any:
        """The options dataclass from keyword arguments (`phalanx.init(**options)`)."""
        known = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise UserError(f"`{unknown[0]}` is not an option of strategy `{self.name}`; its "
                            f"options are: {', '.join(sorted(known)) or 'none'}.")
        return self.options(**given)

    def options_from(self, dist_cfg: Any) -> Any:
        """The options from the `[dist]` config section (fields `flag_prefix + name`)."""
        values = {f.name: getattr(dist_cfg, self.flag_prefix + f.name)
                  for f in dataclasses.fields(self.options)
                  if hasattr(dist_cfg, self.flag_prefix + f.name)}
        return self.options(**values)

    def check(self, options: Any, world: int, cuda: bool) -> None:
        """Refuse a world or device this strategy cannot run on (UserError naming the flag)."""
        for check in self.checks:
            check(options, world, cuda)


def _one_rank(options: Any, world: int, cuda: bool) -> None:
    if world > 1:
        raise UserError(f"`--strategy single` with {world} ranks would train {world} unrelated "
                        f"copies of the model. Use `--strategy ddp` (or zero/fsdp), or run one "
                        f"process (`--nproc-per-node 1`).")


def _sync_bn_on_cuda(options: Any, world: int, cuda: bool) -> None:
    if options.sync_batchnorm and not cuda:
        raise UserError("`--sync-batchnorm` needs CUDA GPUs (torch's SyncBatchNorm only runs on "
                        "GPU modules) and none is visible. Drop the flag on CPU (each rank then "
                        "normalises over its own batch).")


def _zero_needs_ranks(options: Any, world: int, cuda: bool) -> None:
    if world < 2:
        raise UserError("`--strategy zero` at world size 1 means nothing: ZeRO splits the "
                        "optimizer state across ranks, and one rank keeps all of it. Use "
                        "`--strategy single`, or start more ranks (`--nproc-per-node 2`).")


def _offload_on_cuda(options: Any, world: int, cuda: bool) -> None:
    if options.cpu_offload and not cuda:
        raise UserError("`--fsdp-cpu-offload` moves parameters and optimizer state from GPU "
                        "memory to CPU memory; this run is on CPU already. Drop the flag.")


def _grad_sync_known(options: Any, world: int, cuda: bool) -> None:
    if options.grad_sync not in GRAD_SYNC:
        raise UserError(f"`--fsdp-grad-sync` must be one of {', '.join(GRAD_SYNC)}, got "
                        f"{options.grad_sync!r}.")


def _static_graph_without_accumulation(options: Any, grad_accum: int) -> Any:
    """DDP's `static_graph` applies only without accumulation: under it torch cannot skip
    the gradient sync before its first synchronised iteration, so the first window would
    sync every micro-step — the same gradient up to float rounding, but not bit-for-bit
    the windows that follow or a resumed run's first one."""
    return dataclasses.replace(options, static_graph=options.static_graph and grad_accum == 1)


GRAD_SYNC = ("every", "last")
ALL_STATE = frozenset({"parameters", "gradients", "optimizer"})

SPECS: dict[str, StrategySpec] = {spec.name: spec for spec in (
    StrategySpec("single", "one process, nothing to synchronise",
                 "phalanx.strategies.single:SingleStrategy", NoOptions, checks=(_one_rank,),
                 hint="one process splits nothing. Drop the layout flags, or choose ddp/fsdp."),
    StrategySpec("ddp", "DistributedDataParallel: a full replica per rank, gradients "
                        "all-reduced", "phalanx.strategies.ddp:DDPStrategy", DDPOptions,
                 checks=(_sync_bn_on_cuda,), settle=_static_graph_without_accumulation,
                 dims=("dp_replicate",), hint="DDP replicates whole models: it neither "
                 "shards nor splits matrices. Use `--strategy fsdp` (HSDP with "
                 "`--dp-replicate`, tensor parallelism with `--tp`), or drop the flag."),
    StrategySpec("zero", "ZeRO-1: DDP + ZeroRedundancyOptimizer, each rank keeps 1/N of the "
                         "optimizer state", "phalanx.strategies.zero:ZeroStrategy", ZeroOptions,
                 shards=frozenset({"optimizer"}), checks=(_sync_bn_on_cuda, _zero_needs_ranks),
                 settle=_static_graph_without_accumulation, takes_layout=False,
                 hint="ZeRO-1 shards only the optimizer state, over the whole world, and "
                 "takes no mesh. Drop the layout flags, or use `--strategy fsdp` with them."),
    StrategySpec("fsdp", "FSDP2 (fully_shard): parameters, gradients and optimizer state "
                         "sharded (ZeRO-3)", "phalanx.strategies.fsdp:FSDPStrategy", FSDPOptions,
                 shards=ALL_STATE, flag_prefix="fsdp_",
                 checks=(_offload_on_cuda, _grad_sync_known),
                 dims=("dp_shard", "dp_replicate", "tp", "pp"),
                 hint="FSDP2 shards over --dp-shard, replicates its groups over "
                 "--dp-replicate (HSDP), splits matrices over --tp and the model into "
                 "pipeline stages over --pp."),
)}


def spec(name: str) -> StrategySpec:
    if name not in SPECS:
        raise UserError(f"unknown strategy `{name}`; available: {', '.join(SPECS)} "
                        f"(`--strategy`).")
    return SPECS[name]


def default_name(world: int) -> str:
    """The strategy when none is named: ddp for several ranks, single for one."""
    return "ddp" if world > 1 else "single"


@dataclass(frozen=True)
class StrategyChoice:
    """The strategy a job uses, decided once: its spec, the options it is built with, the
    world size it was decided for (`phalanx.init` refuses it in another world) and the
    mesh's layout in that world (`config.layout`)."""

    spec: StrategySpec
    options: Any
    world: int
    layout: Layout

    @property
    def name(self) -> str:
        return self.spec.name

    def check(self, cuda: bool) -> None:
        """The spec's checks for this world and device kind (UserError naming the flag)."""
        self.spec.check(self.options, self.world, cuda)

    def kwargs(self) -> dict[str, Any]:
        """The options as `phalanx.init` keyword arguments ({name: value})."""
        return {f.name: getattr(self.options, f.name)
                for f in dataclasses.fields(self.options)}


def choose(dist_cfg: Any, world: int, grad_accum: int) -> StrategyChoice:
    """The one place a run's strategy is decided: `--strategy`, or the default for `world`
    ranks; its options from the `[dist]` fields, settled for `grad_accum` micro-steps per
    optimizer step (the spec's rule, e.g. DDP's static graph only without accumulation)."""
    request = requested(dist_cfg)
    found, layout = laid_out(dist_cfg.strategy, request, world)
    if not dist_cfg.strategy and given(request):
        refuse_foreign(dist_cfg, found.name)  # the layout chose it (DistConfig: the rest)
    options = found.options_from(dist_cfg)
    if found.settle is not None:
        options = found.settle(options, grad_accum)
    return StrategyChoice(found, options, world, layout)


def choose_for_script(name: str | None, world: int, **options: Any) -> StrategyChoice:
    """A script's `phalanx.init(strategy=name, **options)`: the named strategy (None: the
    default for `world` ranks, or the one the layout keywords `dp_replicate`/`dp_shard`
    mean) with exactly the options given, checked against its spec."""
    request = {d: options.pop(d, None) for d in DIMS}
    found, layout = laid_out(name, request, world)
    return StrategyChoice(found, found.make_options(**options), world, layout)


def check_layout(found: StrategySpec, request: dict[str, int | None],
                 layout: Layout | None = None) -> None:
    """A layout flag the strategy does not take, in one line: any, for a strategy that
    takes none (zero); else a dimension it does not span above 1 — as given (-1 is decided
    with the world), or as `layout` resolved it."""
    flags = given(request)
    if flags and not found.takes_layout:
        raise UserError(f"`--strategy {found.name}` with `{said(request)}`: {found.hint}")
    for d, v in flags.items():
        size = getattr(layout, d) if layout is not None else v
        if d not in found.dims and size not in (1, REST):
            raise UserError(f"`--strategy {found.name}` with `{said(request)}`: {found.hint}")


def laid_out(name: str | None, request: dict[str, int | None], world: int
             ) -> tuple[StrategySpec, Layout]:
    """The strategy and the mesh layout for `world` ranks. Without a name, the layout
    chooses: a sharded or tensor-parallel dimension means fsdp (HSDP when replicated too),
    replicas alone ddp, nothing given the world's default. The strategy's dimensions not
    given take the rest of the world, its own first (fsdp: dp_shard, then dp_replicate);
    with --tp, fsdp's dp_shard may be 1 (FSDP2 then only replicates, over dp_replicate)."""
    if name is None and given(request):
        probe = fill(request, world, ("dp_shard", "dp_replicate"))
        name = "fsdp" if probe.dp_shard > 1 or probe.tp > 1 or probe.pp > 1 \
            else "ddp" if probe.dp_replicate > 1 else default_name(world)
    found = spec(name or default_name(world))
    check_layout(found, request)
    layout = fill(request, world, found.dims or ("dp_replicate",))
    check_layout(found, request, layout)
    if found.sharded and world > 1 and layout.dp_shard == 1 and layout.tp == 1:
        raise UserError(f"`--strategy {found.name}` with `{said(request)}` shards nothing "
                        f"(--dp-shard 1). Use `--strategy ddp` to replicate, or give "
                        f"`--dp-shard` a size above 1.")
    return found, layout


def refuse_foreign(dist_cfg: Any, chosen: str) -> None:
    """A `[dist]` option of another strategy than `chosen`, set away from its default, is
    refused in one line: it would have no effect."""
    fields = {f.name: f for f in dataclasses.fields(dist_cfg)}
    defaults = SimpleNamespace(**{n: f.default for n, f in fields.items()})
    foreign = foreign_options(dist_cfg, chosen, defaults)
    if foreign:
        f = fields[foreign[0]]
        owners = [s.name for s in SPECS.values() if f.name.startswith(s.flag_prefix)
                  and s.flag_prefix]
        raise UserError(f"`{flag_of(f)}` is an option of `--strategy "
                        f"{'/'.join(owners) or 'ddp/zero'}`, and this run uses "
                        f"`{chosen}`: it would have no effect. Drop it, or choose that "
                        f"strategy.")


def foreign_options(dist_cfg: Any, chosen: str, defaults: Any) -> list[str]:
    """Config fields set away from their default that belong only to strategies other than
    `chosen` (e.g. `--fsdp-cpu-offload` with ddp): [field name, ...]."""
    mine = {SPECS[chosen].flag_prefix + f.name for f in dataclasses.fields(SPECS[chosen].options)}
    found = []
    for other in SPECS.values():
        for f in dataclasses.fields(other.options):
            name = other.flag_prefix + f.name
            if name not in mine and hasattr(dist_cfg, name) and name not in found \
                    and getattr(dist_cfg, name) != getattr(defaults, name):
                found.append(name)
    return found
