"""The parallel layout: the device mesh's dimensions, with torchtitan's names, and what
they mean for the strategy. Torch-free: the launcher checks a request before any worker
starts, and each attempt resolves it for the world it joined (`resolve`, called by
`config.strategy.choose`).

- `dp_replicate`: groups of ranks that hold the same weights (DDP's replicas, or HSDP's
  replicate dimension).
- `dp_shard`: ranks among which FSDP2 splits parameters, gradients and optimizer state.
- `tp`: ranks among which tensor parallelism splits each block's matrices (torch's
  `parallelize_module`), inside each data-parallel rank; FSDP2 shards (and, with
  `dp_replicate`, replicates) over the other dimensions.
- `pp`: pipeline stages: the model cut by blocks into `pp` consecutive stages
  (`strategies.pipeline`), outermost: a stage's ranks are the other dimensions' mesh.
  Scripts train with it (`run.forward_backward`); `phalanx train` does not yet.

A request holds, per dimension, None (not given), a size >= 1, or -1: "the rest of the
world" (at most one). `--strategy fsdp` is `--dp-shard -1`, `--strategy ddp` is
`--dp-replicate -1`; layout flags without `--strategy` choose it: any sharded dimension
means fsdp (HSDP when replicated too), replication alone means ddp (the registry,
`config.strategy.choose`, says which strategy takes which dimension).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from phalanx.errors import UserError

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")  # the mesh's order, outermost first
REST = -1


def flag(dim: str) -> str:
    return "--" + dim.replace("_", "-")


@dataclass(frozen=True)
class Layout:
    """A resolved mesh: each dimension's size; their product is the world size."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def world(self) -> int:
        return math.prod(dataclasses.astuple(self))

    @property
    def hybrid(self) -> bool:
        """HSDP: sharded inside groups, the groups replicas of each other."""
        return self.dp_replicate > 1 and self.dp_shard > 1

    def mesh_dims(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The sharded strategy's mesh: ("dp",) over the world, (dp_replicate, dp_shard)
        for HSDP (FSDP2 shards on the last dimension, replicates on the first), or with
        tensor parallelism (dp_replicate, dp_shard, tp), sizes of 1 included: rank
        ((r·S) + s)·T + t, so a tp group is T consecutive ranks; with pipeline stages all
        four (pp, dp_replicate, dp_shard, tp), a stage's ranks consecutive."""
        if self.pp > 1:
            return DIMS, (self.pp, self.dp_replicate, self.dp_shard, self.tp)
        if self.tp > 1:
            return (("dp_replicate", "dp_shard", "tp"),
                    (self.dp_replicate, self.dp_shard, self.tp))
        if self.hybrid:
            return ("dp_replicate", "dp_shard"), (self.dp_replicate, self.dp_shard)
        return ("dp",), (self.world,)

    def across_machines(self, per_machine: int, machines: int) -> str | None:
        """A note when a sharded group of ranks spans machines (FSDP all-gathers and
        reduce-scatters every layer: on the slow network then), with the HSDP layout that
        keeps it inside one; None when each group stays on one machine. Ranks are numbered
        machine by machine, and a dp_shard group is `dp_shard` consecutive ranks."""
        if machines >= 2 and self.tp > 1 and per_machine % self.tp:
            return (f"tp {self.tp} spans machines ({per_machine} ranks per machine): tensor "
                    f"parallelism all-reduces every block's activations, forward and "
                    f"backward, and would cross the network; a --tp that divides "
                    f"{per_machine} keeps each group inside one.")
        S, room = self.dp_shard, per_machine // self.tp  # (a group's ranks lie tp apart)
        if machines < 2 or S < 2 or per_machine % (S * self.tp) == 0:
            return None
        fix = (f"`--dp-shard {room}` (HSDP: --dp-replicate takes the rest) keeps them "
               f"inside one" if S % room == 0 and self.world % per_machine == 0
               else f"a --dp-shard that divides {room} keeps them inside one")
        if room == 1 and self.world % per_machine == 0:  # one tp group a machine
            fix = (f"`--dp-replicate {self.world // self.tp}` (one tp group a machine, "
                   f"FSDP2's replicas across them) keeps them inside one")
        return (f"dp_shard {S} spans machines ({per_machine} ranks per machine): FSDP's "
                f"all-gathers and reduce-scatters cross the network every layer; {fix}.")

    def describe(self) -> str:
        """E.g. "dp_replicate 2 × dp_shard 2" (the dimensions above 1; "1 rank" if none)."""
        dims = [f"{d} {getattr(self, d)}" for d in DIMS if getattr(self, d) > 1]
        return " × ".join(dims) or "1 rank"


def requested(dist_cfg: Any) -> dict[str, int | None]:
    """{dimension: None, a size, or -1} from the `[dist]` fields of the same names."""
    return {d: getattr(dist_cfg, d, None) for d in DIMS}


def check_request(request: dict[str, int | None]) -> None:
    """What can be refused before the world is known, each in one line naming the flag:
    sizes are -1 or >= 1, one -1 at most, and pp a number of stages. (Whether the
    strategy takes these dimensions is its spec's: `config.strategy.check_layout`.)"""
    given = {d: v for d, v in request.items() if v is not None}
    for d, v in given.items():
        if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != REST):
            raise UserError(f"`{flag(d)}` must be a whole number >= 1, or -1 for the rest of "
                            f"the world; got {v!r}.")
    rest = [d for d, v in given.items() if v == REST]
    if len(rest) > 1:
        raise UserError(f"`{flag(rest[0])} -1` and `{flag(rest[1])} -1`: only one dimension "
                        f"can take the rest of the world. Give the other a size.")
    if given.get("pp") == REST:
        raise UserError("`--pp -1`: give the pipeline's stages a number (the model is cut "
                        "into that many); another dimension can take the rest.")


def given(request: dict[str, int | None]) -> dict[str, int]:
    return {d: v for d, v in request.items() if v is not None}


def said(request: dict[str, int | None]) -> str:
    """The layout flags given, as typed: "--dp-replicate 2 --dp-shard -1"."""
    return " ".join(f"{flag(d)} {v}" for d, v in given(request).items())


def fill(request: dict[str, int | None], world: int, open_dims: tuple[str, ...]) -> Layout:
    """The layout for `world` ranks: dimensions not given are 1, except the first of
    `open_dims` (the strategy's own, in order) not given, which takes the rest when no
    dimension is -1; the product checked."""
    check_request(request)
    sizes = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1, **given(request)}
    open_dim = next((d for d in open_dims if d not in given(request)), None)
    if REST not in sizes.values() and open_dim is not None:
        sizes[open_dim] = REST
    known = math.prod(v for v in sizes.values() if v != REST)
    shown = said(request) or f"{flag(open_dims[0])} -1"
    if world % known:
        raise UserError(f"the layout `{shown}` needs a multiple of {known} ranks, and this "
                        f"job has {world}: {known} does not divide {world}. Change the "
                        f"sizes or the number of processes.")
    filled = {d: (world // known if v == REST else v) for d, v in sizes.items()}
    if math.prod(filled.values()) != world:
        raise UserError(f"the layout `{shown}` spans {known} ranks, and this job has {world}: "
                        f"the sizes must multiply to the world size (or give one of them "
                        f"-1 for the rest).")
    return Layout(**filled)


def minigpt_tp_refusal(n_head: int, tp: int) -> str | None:
    """Why MiniGPT with `n_head` heads cannot be split over `tp` ranks (None: it can):
    checked before launch (`Config`) and by the model itself at setup."""
    if n_head % tp:
        return f"--n-head {n_head} does not divide into {tp} tensor-parallel ranks"
    return None


SCHEDULES = ("gpipe", "1f1b")  # torch's single-stage-per-rank schedules


def stage_blocks(n_layer: int, stages: int, stage: int) -> range:
    """The blocks pipeline stage `stage` of `stages` holds: consecutive, the first stages
    one more when `stages` does not divide `n_layer` evenly."""
    per, extra = divmod(n_layer, stages)
    start = stage * per + min(stage, extra)
    return range(start, start + per + (stage < extra))


def stage_refusal(n_layer: int, pp: int, tied: bool, untie: str = "train with an untied "
                                                                  "head") -> str | None:
    """Why a model of `n_layer` blocks cannot be cut into `pp` pipeline stages (None: it
    can), in the words of the flag to change (`untie`: how the caller unties the head)."""
    if n_layer < pp:
        return (f"--n-layer {n_layer} cannot fill {pp} pipeline stages: every stage needs a "
                f"block")
    if tied:
        return ("the token embedding (first stage) and the output head (last stage) are tied: "
                f"pipeline stages cannot share a weight; {untie}")
    return None


def schedule_refusal(pp: int, schedule: str, microbatches: int,
                     more: str = "microbatches={n}") -> str | None:
    """What torch's schedules would refuse after the first step starts, said before it
    (None: they take it). `more`: how the caller passes n micro-batches."""
    if schedule not in SCHEDULES:
        return f"the schedule {schedule!r} is not one of {', '.join(SCHEDULES)}"
    if microbatches < pp:
        return (f"{microbatches} micro-batch(es) leave {pp} pipeline ranks idle (the schedule "
                f"needs at least one per stage): pass {more.format(n=pp)} or more")
    return None


def trainer_pipeline_refusal(cfg: Any) -> str | None:
    """Why `phalanx train` cannot run `cfg` under `--pp` (None: it can, or no --pp), in the
    words of the flag to change — said before launch. The micro-batches are --grad-accum's."""
    pp, t, m, d = cfg.dist.pp, cfg.train, cfg.model, cfg.dist
    if not isinstance(pp, int) or pp < 2:
        return None
    said = schedule_refusal(pp, d.pp_schedule, t.grad_accum, more="--grad-accum {n}")
    if said is None and m.factory is None:
        said = stage_refusal(m.n_layer, pp, m.tie_embeddings,
                             untie="train with an untied head (leave out --tie-embeddings)")
    if said is not None:
        return said
    refused = [(t.precision != "fp32", f"--precision {t.precision} (stages train in fp32 in "
                                       f"this version)"),
               (t.compile, "--compile"),
               (d.fault_tolerance != "none", f"--fault-tolerance {d.fault_tolerance}"),
               (m.init_from is not None, "--init-from (a pretrained start is loaded into "
                                         "the whole model)"),
               (d.check_consistency_every > 0, "--check-consistency-every (each stage holds "
                                               "its own parameters)")]
    found = [what for hit, what in refused if hit]
    if found:
        return f"{found[0]} is not built under pipeline stages yet; leave it out"
    return None


def refuse_pp(pp: int | None, verb: str) -> None:
    """`phalanx bench` does not time pipeline stages yet: one line. (`phalanx plan` plans
    them: plan.pipeline.)"""
    if isinstance(pp, int) and pp > 1:
        raise UserError(f"`--pp {pp}`: `phalanx {verb}` does not model pipeline stages yet "
                        f"(`phalanx train --pp {pp}` and scripts train with them); leave "
                        f"--pp out here.")
