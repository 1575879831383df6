"""Kubeflow's PyTorchJob operator, read as configuration: in a pod it starts, the `PET_*`
variables it sets are `[dist]` values of the lowest precedence (a TOML file or a flag
overrides them)."""

from __future__ import annotations

from typing import Any


def operator_pod(environ: dict) -> bool:
    """A pod of Kubeflow's PyTorchJob started for torchrun-style launching: the operator
    sets PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_ADDR/PORT, and its
    RANK is the pod's index — a node rank, not a process rank."""
    return "PET_NPROC_PER_NODE" in environ and "PET_NNODES" in environ


def operator_dist(environ: dict) -> dict[str, Any]:
    """`[dist]` values from the operator's variables (lowest precedence: a TOML file or a
    flag overrides them)."""
    if not operator_pod(environ) or "TORCHELASTIC_RUN_ID" in environ:
        return {}
    out: dict[str, Any] = {"nnodes": environ["PET_NNODES"]}
    procs = environ["PET_NPROC_PER_NODE"]
    if procs.isdigit():
        out["nproc_per_node"] = int(procs)
    if environ.get("PET_NODE_RANK", "").isdigit():
        out["node_rank"] = int(environ["PET_NODE_RANK"])
    if environ.get("PET_MASTER_ADDR") and environ.get("PET_MASTER_PORT"):
        out["rdzv_endpoint"] = f"{environ['PET_MASTER_ADDR']}:{environ['PET_MASTER_PORT']}"
    return out
