"""`phalanx plan --simulate`'s comparison: simulated beside predicted per strategy and
component, the communication per step beside the planner's, and — where they differ by
more than `BAND` — a line saying where and why (the shard layout this rank got, ZeRO's
whole-parameter partition, the moment of the peak, collectives the planner does not
count), or saying plainly that no known cause explains it."""

from __future__ import annotations

from collections import defaultdict

from phalanx.plan import formulas as f
from phalanx.plan.compare import COMPARED, NEGLIGIBLE
from phalanx.plan.estimate import VARIANTS, Variant

BAND = 0.10  # simulated and predicted agree within 10 %
ALL_REDUCE = ("allreduce_", "all_reduce", "allreduce_coalesced_")
# DTensor's functional collectives: tensor parallelism's, over its T ranks (FSDP2 calls
# the c10d ops: `_allgather_base_`, `_reduce_scatter_base_`, `allreduce_`)
TP_OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def sent_bytes(op: str, nbytes: int, W: int) -> float:
    """Bytes one rank sends for a collective over `nbytes` (its largest tensor), in the
    planner's ring convention (phalanx.plan.formulas): all-reduce 2·(W−1)/W·n; all-gather,
    reduce-scatter and broadcast (W−1)/W·n."""
    if W == 1:
        return 0.0
    return (2.0 if op in ALL_REDUCE else 1.0) * (W - 1) / W * nbytes


def group_size(v: Variant, op: str, W: int) -> int:
    """The ranks a collective of `op` spans: the world, or under HSDP a replica group's
    dp_shard ranks (FSDP's all-gathers and reduce-scatters) and the dp_replicate groups
    (the gradient shards' all-reduce; the few small all-reduces of the step, such as the
    gradient norm's, counted with it). Under tensor parallelism the functional
    collectives (DTensor's: `TP_OPS`) span the T ranks of a TP group, and FSDP's its S."""
    if v.tp > 1 and op in TP_OPS:
        return v.tp
    if v.replicate == 1:
        return v.shard_ranks(W)
    return v.replicate if op in ALL_REDUCE else v.shard_ranks(W)


def predicted_comm(cfg, v: Variant, W: int) -> float:
    """The planner's bytes per rank per optimizer step (what its table's comm says)."""
    from phalanx.plan.recommend import comm_passes, facts_for

    return sum(comm_passes(cfg, facts_for(cfg, variant=v), v, W).values())


def compare_variant(cfg, v: Variant, sim: dict, row: dict, W: int, rank: int) -> dict:
    """{"components": {name: {"predicted", "simulated", "ratio", "within"}}, "moment",
    "predicted_moment", "comm", "why": [lines], "note"}."""
    comps = {}
    for name, parts in COMPARED.items():
        p, s = sum(row[k] for k in parts), sim[name]
        small = name != "peak" and max(p, s) < NEGLIGIBLE * sim["peak"]
        ratio = s / p if p else None
        comps[name] = {"predicted": p, "simulated": s, "ratio": ratio,
                       "within": small or (ratio is not None and abs(ratio - 1) <= BAND)
                       or p == s}
    by_op: dict[str, float] = defaultdict(float)
    for op, n in sim["collectives"]:
        by_op[op] += sent_bytes(op, n, group_size(v, op, W))
    pc = predicted_comm(cfg, v, W)
    total = sum(by_op.values())
    comm = {"predicted": pc, "simulated": total, "ratio": total / pc if pc else None,
            "by_op": dict(by_op),
            "within": abs(total - pc) <= BAND * max(pc, 1.0) or max(total, pc) < 1 << 10}
    out = {"components": comps, "moment": sim["moment"], "predicted_moment": row["moment"],
           "comm": comm, "note": sim.get("note", ""), "fake": sim.get("fake", False),
           "checkpoint": {"simulated": sim.get("checkpoint"),
                          "even_share": _checkpoint_share(cfg, W), "copies": v.replicate}}
    out["why"] = explain(cfg, v, out, sim, W, rank)
    return out


def _checkpoint_share(cfg, W: int) -> float:
    """1/W of the whole checkpoint: every parameter and its optimizer state (fp32)."""
    from phalanx.plan.estimate import optimizer_bytes
    from phalanx.plan.recommend import facts_for

    ddp = VARIANTS[0]
    facts = facts_for(cfg, variant=ddp)
    return (f.param_bytes(facts.param_shapes) + optimizer_bytes(facts, ddp, 1)) / W


def explain(cfg, v: Variant, cmp: dict, sim: dict, W: int, rank: int) -> list[str]:
    """One line per cause found for a difference over BAND; a plain "not explained" line
    for a component no known cause covers."""
    label = v.label
    off = [n for n, c in cmp["components"].items() if not c["within"]]
    lines: list[str] = []
    if "no repeated blocks" in cmp["note"]:
        lines.append(f"{label}: {cmp['note']} — the planner assumed per-block gathering")
    covered: set[str] = set()
    W = v.shard_ranks(W)  # (HSDP: a replica group's ranks split each one)
    short = {n: s for n, s in sim.get("shards", {}).items() if s[1] != -(-s[0] // W)}
    if short and set(off) & {"parameters", "gradients", "optimizer", "peak"}:
        lines.append(_shard_line(label, short, W, rank))
        covered |= {"parameters", "gradients", "optimizer", "peak"}
    padded = _padding(cfg, v, W)
    if padded and (set(off) & {"activations", "peak"} or not cmp["comm"]["within"]):
        lines.append(padded)  # the gathered blocks kept since forward (no reshard) too
        covered |= {"activations", "peak", "parameters"}
    if label == "zero" and "optimizer" in off:
        lines.append(_zero_line(cfg, W, rank, cmp["components"]["optimizer"]))
        covered |= {"optimizer", "peak"}
    if off and not _same_moment(cmp["moment"], cmp["predicted_moment"]):
        lines.append(f"{label}: the peak falls at {cmp['moment']}; the formulas put it at "
                     f"{cmp['predicted_moment']}, where different tensors are alive")
        covered |= {"activations", "peak", "gradients", "parameters"}
    for name in off:
        if name not in covered:
            c = cmp["components"][name]
            lines.append(f"{label}: {name} simulated {_mib(c['simulated'])} vs predicted "
                         f"{_mib(c['predicted'])}: not explained by the shard layout, ZeRO's "
                         f"partition or the peak's moment — the formulas' model of {name} "
                         f"(phalanx.plan.formulas) and what the step allocates differ")
    if not cmp["comm"]["within"]:
        lines.append(_comm_line(label, cmp["comm"]))
    return lines


def _same_moment(sim: str, predicted: str) -> bool:
    """"backward, blocks.3…" ~ "block 3 backward"; "optimizer step…" ~ "optimizer step"."""
    if sim.startswith("optimizer") or predicted.startswith("optimizer"):
        return sim.startswith("optimizer") == predicted.startswith("optimizer")
    return sim.split(",")[0] in predicted


def _shard_line(label: str, shards: dict, W: int, rank: int) -> str:
    name, (d0, rows, even) = max(shards.items(), key=lambda kv: abs(kv[1][1] - kv[1][2]))
    return (f"{label}: {len(shards)} parameter(s) have a dim 0 that {W} ranks do not split "
            f"evenly (e.g. `{name}`, dim 0 = {d0}: rank {rank} holds {rows} row(s), an even "
            f"share is {even:.2f}); FSDP pads every rank to ⌈{d0}/{W}⌉ = {-(-d0 // W)} rows "
            f"for its collectives but ranks past the last row hold none — the formulas count "
            f"⌈d0/W⌉ rows on every rank")


def _padding(cfg, v: Variant, W: int) -> str | None:
    """FSDP gathers and reduces padded tensors (⌈d0/W⌉·W rows each): a line when that
    makes one block's collective buffers over BAND/2 larger than its parameters (the
    planner counts them padded too: `formulas.gathered_bytes`)."""
    from phalanx.plan.recommend import facts_for

    if not v.sharded:
        return None
    facts = facts_for(cfg, variant=v)
    exact = f.param_bytes(facts.block_shapes)
    padded = W * f.param_bytes(facts.block_shapes, W, sharded=True)
    if padded <= (1 + BAND / 2) * exact:
        return None
    whole = W * f.param_bytes(facts.param_shapes, W, sharded=True)
    return (f"{v.label}: at {W} ranks FSDP's collectives move padded tensors (each parameter "
            f"⌈d0/{W}⌉·{W} rows): one block's gather or reduce-scatter buffer is "
            f"{_mib(padded)}, its parameters {_mib(exact)}; the whole model "
            f"{_mib(whole)} vs {_mib(f.param_bytes(facts.param_shapes))} (the planner "
            f"counts the gathered blocks, the buffers in flight and the communication "
            f"padded, as here)")


def _zero_line(cfg, W: int, rank: int, c: dict) -> str:
    from phalanx.plan.recommend import facts_for

    v = next(v for v in VARIANTS if v.label == "zero")
    facts = facts_for(cfg, variant=v)
    owner = f.zero_assignment(facts.param_shapes, W, facts.groups())
    mine = sum(1 for r in owner if r == rank)
    return (f"zero: ZeroRedundancyOptimizer gives whole parameters to ranks ({len(owner)} "
            f"parameters over {W} ranks): rank {rank} owns {mine}, "
            f"{_mib(c['simulated'])} of state; the plan shows the fullest rank "
            f"({_mib(c['predicted'])}). Simulate another rank with --simulate-rank")


def _comm_line(label: str, comm: dict) -> str:
    parts = ", ".join(f"{op} {n / 2**20:.2f} MiB" for op, n in
                      sorted(comm["by_op"].items(), key=lambda kv: -kv[1]))
    return (f"{label}: sends {comm['simulated'] / 2**20:.2f} MiB per step ({parts or 'none'}); "
            f"the planner counts {comm['predicted'] / 2**20:.2f} MiB: the gradients' and "
            f"parameters' collectives (not buffers broadcast in forward, nor the "
            f"gradient norm's all-reduce)")


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def compare_all(cfg, found: dict, rows: dict) -> dict:
    """simulate()'s result beside the plan's rows: {"world_size", "rank", "variants":
    {label: compare_variant(...) | {"skipped"} | {"failed"}}}."""
    W = found["world_size"]
    out = {"world_size": W, "variants": {}}
    for label, sim in found["variants"].items():
        if "skipped" in sim or "failed" in sim:
            out["variants"][label] = {k: x for k, x in sim.items() if k != "variant"}
        else:
            out["variants"][label] = {**compare_variant(cfg, sim["variant"], sim,
                                                        rows[label], W, sim["rank"]),
                                      "rank": sim["rank"], "seconds": sim.get("seconds")}
    return out


NAMES = ("parameters", "gradients", "optimizer", "activations", "peak")


def print_simulated(result: dict) -> None:
    """One table (strategy, component, predicted, simulated, ratio: narrow enough for 80
    columns), then each strategy's peak moment, its difference lines, or why it did not
    run."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"simulated vs predicted at {result['world_size']} ranks (MiB on "
                        f"the rank simulated)")
    for column in ("strategy", "component", "plan", "sim", "ratio", "ok"):
        table.add_column(column, no_wrap=True,
                         justify="left" if column in ("strategy", "component") else "right")
    for label, v in result["variants"].items():
        if "components" not in v:
            table.add_row(label, "—", "—", "—", "—", "NO" if "failed" in v else "skip")
            continue
        for i, name in enumerate((*NAMES, "comm/step")):
            c = v["comm"] if name == "comm/step" else v["components"][name]
            table.add_row(label if i == 0 else "", name, f"{c['predicted'] / 2**20:.2f}",
                          f"{c['simulated'] / 2**20:.2f}",
                          "—" if c["ratio"] is None else f"{c['ratio']:.3f}",
                          "yes" if c["within"] else "NO",
                          end_section=name == "comm/step")
    console.print(table)
    for label, v in result["variants"].items():
        if "components" not in v:
            console.print(f"{label}: {v.get('failed') or v.get('skipped')}")
            continue
        console.print(f"{label}: rank {v['rank']}, peak at {v['moment']} (plan: "
                      f"{v['predicted_moment']})")
        ck = v["checkpoint"]
        console.print("  checkpoint: " + _checkpoint_line(ck, result["world_size"]))
        for line in v["why"]:
            console.print(f"  why: {line}")


def _checkpoint_line(ck: dict, W: int) -> str:
    """What this rank's DCP local save plan holds, beside an even 1/W share; under HSDP
    every replica group plans the whole (R copies), which DCP's cross-rank step (not run
    here) deduplicates and spreads over the ranks."""
    if isinstance(ck["simulated"], str):
        return ck["simulated"]
    line = (f"this rank writes {_mib(ck['simulated'])} (DCP's local save plan); 1/{W} of "
            f"the whole is {_mib(ck['even_share'])}")
    copies = ck.get("copies", 1)
    if copies > 1:
        line += (f" — the plan holds its replica group's share of each of the {copies} "
                 f"copies' tensors; DCP's global planning (not simulated) keeps one copy "
                 f"and spreads the writes: about {_mib(ck['simulated'] / copies)}")
    return line
