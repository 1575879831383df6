"""What a SLURM job step tells its tasks, read without `scontrol`: the host list
(`node[01-03,7],gpu5` expanded as `scontrol show hostnames` does), tasks per node
(`2(x3),1`), and where the ranks meet (the first host; a port SLURM reserved for the
step, or one derived from the job).

`srun` sets no MASTER_ADDR/MASTER_PORT; torchrun does, and under `srun … torchrun` its
variables win (they are read first).
"""

from __future__ import annotations

import re

from phalanx.errors import UserError

PORT_BASE, PORT_SPAN = 20000, 20000  # 20000–39999: above the usual services, below ephemeral


def split_top(text: str) -> list[str]:
    """Split at commas outside brackets: `a[1,2],b` → [`a[1,2]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0:
            raise ValueError("unbalanced `]`")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("unbalanced `[`")
    parts.append(text[start:])
    return parts


def _ranges(spec: str) -> list[str]:
    values = []
    for item in spec.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"`{item}` is not a number or a range")
        width = len(low)
        end = int(high) if high else int(low)
        if end < int(low):
            raise ValueError(f"range `{item}` runs backwards")
        values += [str(n).zfill(width) for n in range(int(low), end + 1)]
    return values


def _expand_one(item: str) -> list[str]:
    found = re.search(r"\[([^\[\]]*)\]", item)
    if found is None:
        return [item]
    head, tail = item[:found.start()], item[found.end():]
    return [name for value in _ranges(found[1]) for name in _expand_one(head + value + tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names in a SLURM node list; UserError naming the list when it is malformed."""
    try:
        hosts = [h for part in split_top(nodelist.strip()) if part
                 for h in _expand_one(part)]
    except ValueError as exc:
        raise UserError(f"SLURM node list `{nodelist}` is malformed ({exc}); expected e.g. "
                        f"`node[01-04,7],gpu5` as SLURM writes SLURM_JOB_NODELIST.") from None
    if not hosts or any(not h or "[" in h or "]" in h for h in hosts):
        raise UserError(f"SLURM node list `{nodelist}` names no hosts.")
    return hosts


def tasks_per_node(spec: str) -> list[int]:
    """`2(x3),1` → [2, 2, 2, 1] (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE)."""
    counts = []
    for item in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if found is None:
            raise UserError(f"SLURM tasks-per-node `{spec}` is malformed; expected e.g. "
                            f"`2(x3),1`.")
        counts += [int(found[1])] * int(found[2] or 1)
    return counts


def rendezvous(environ: dict) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT for a job step that does not set them: the step's first
    host, and a port from the job and step ids (the same on every task)."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise UserError("under srun but SLURM_STEP_NODELIST/SLURM_JOB_NODELIST is not set: "
                        "cannot tell where rank 0 runs. Set MASTER_ADDR and MASTER_PORT.")
    return {"MASTER_ADDR": expand_nodelist(nodelist)[0],
            "MASTER_PORT": str(candidate_ports(environ)[0])}


CANDIDATES = 8


def candidate_ports(environ: dict) -> list[int]:
    """Where the step's rank 0 may serve its store, in order, the same on every task.

    SLURM_STEP_RESV_PORTS (srun's `--resv-ports`, or MpiParams=ports=… in slurm.conf) are
    reserved for this step: no other step on the node has them. Otherwise ports derived
    from the job and step ids — two jobs sharing a node can derive the same one, so rank 0
    takes the first free candidate and the others find it by the step's id
    (`phalanx.cluster.slurm_store`).
    """
    reserved = _port_list(environ.get("SLURM_STEP_RESV_PORTS", ""))
    if reserved:
        return reserved[:CANDIDATES]
    job = environ.get("SLURM_JOB_ID", "0")
    step = environ.get("SLURM_STEP_ID", "0")
    seed = (int(job) if job.isdigit() else 0) * 31 + (int(step) if step.isdigit() else 0)
    return [PORT_BASE + (seed + k * 4099) % PORT_SPAN for k in range(CANDIDATES)]


def _port_list(text: str) -> list[int]:
    """`12000-12003,12010` → [12000, 12001, 12002, 12003, 12010] (malformed: [])."""
    ports: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return []
        ports.extend(range(int(low), int(high or low) + 1))
    return [p for p in ports if 0 < p < 65536]


def step_id(environ: dict) -> str:
    """`JOB.STEP`: what rank 0 writes in its store so that no other job's is taken for it."""
    return f"{environ.get('SLURM_JOB_ID', '?')}.{environ.get('SLURM_STEP_ID', '?')}"
