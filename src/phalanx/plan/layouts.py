"""`phalanx plan --layouts`: the N-D layouts worth planning for W ranks on machines of
`per_machine` ranks, beside the 1-D strategies — so the recommendation can propose one
and say why (e.g. "hsdp (8 × 8) … tensor parallelism not needed").

Candidates, as torchtitan lays meshes out: tensor parallelism only inside a machine (T
divides the ranks per machine and the heads; its all-reduces sit between matmuls), FSDP
over the rest of the machine (S = per_machine / T) and replica groups across machines
(R = W / (T·S), HSDP), or FSDP over every data-parallel rank when there is one machine.
Pipeline stages across machines (`pipeline_candidates`), where torchtitan puts them: P
stages of W/P ranks, FSDP inside a machine and HSDP over a stage's machines."""

from __future__ import annotations

from phalanx.config.layout import trainer_pipeline_refusal
from phalanx.plan.estimate import Variant, mesh_variant, pipeline_variant

TP_SIZES = (2, 4, 8)
PP_SIZES = (2, 4, 8)


def pipeline_candidates(cfg, W: int, per_machine: int, keeps_outputs: bool = False
                        ) -> tuple[Variant, ...]:
    """pp P × (HSDP over the stage's machines, FSDP inside each) for each P in PP_SIZES
    that divides the machines — when `phalanx train --pp P` would take the config (enough
    micro-batches, an untied head, fp32, ...) and the planner models it
    (`plan.pipeline.unplanned`); none on one machine."""
    from phalanx.plan.pipeline import unplanned

    machines = W // per_machine if W % per_machine == 0 and per_machine > 1 else 0
    out: list[Variant] = []
    for P in PP_SIZES:
        staged = cfg.with_dist(pp=P)  # (not validated: a refusal is checked below)
        if P > machines or machines % P or trainer_pipeline_refusal(staged) or \
                unplanned(staged):
            continue
        out.append(pipeline_variant(P, cfg.dist.pp_schedule, machines // P, per_machine,
                                    reshard=cfg.dist.fsdp_reshard_after_forward,
                                    keeps_outputs=keeps_outputs))
    return tuple(out)


def candidates(cfg, W: int, per_machine: int) -> tuple[Variant, ...]:
    """The layouts above for `cfg`'s model (a TP size that does not divide the heads, or
    an option the TP model does not cover, is left out)."""
    from phalanx.plan.tensor_parallel import tp_refusal

    reshard = cfg.dist.fsdp_reshard_after_forward
    out: list[Variant] = []
    if W > per_machine and W % per_machine == 0 and per_machine > 1:
        out.append(mesh_variant(W // per_machine, per_machine, reshard=reshard))
    if tp_refusal(cfg) is not None:
        return tuple(out)
    for T in TP_SIZES:
        if T > per_machine or per_machine % T or W % T or cfg.model.n_head % T or W == T:
            continue
        S = per_machine // T if W > per_machine else W // T
        if W % (T * S) == 0:
            out.append(mesh_variant(W // (T * S), S, T, reshard=reshard))
    return tuple(out)


def why_not_tp(rows: list[dict], best: dict) -> str:
    """A clause for the recommendation when it has no tensor parallelism and TP rows were
    planned: the best TP row's time for the same global batch, or that none fits."""
    tp_rows = [r for r in rows if r.get("tp", 1) > 1]
    if best.get("tp", 1) > 1 or not tp_rows:
        return ""
    fitting = [r for r in tp_rows if r["fits"] and "time" in r]
    if not fitting:
        return "; tensor parallelism not needed (no TP layout fits here)"
    fastest = min(fitting, key=lambda r: r["time"]["step_s"] * r["tp"])
    return (f"; tensor parallelism not needed (the fastest TP layout, {fastest['strategy']}, "
            f"takes {fastest['time']['step_s'] * fastest['tp'] * 1e3:.1f} ms for the same "
            f"global batch)")
