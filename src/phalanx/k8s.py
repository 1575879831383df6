"""Kubernetes through Kubeflow's training operator (PyTorchJob, kubeflow.org/v1).

`phalanx k8s [train options] --nodes N --image IMG` renders a PyTorchJob manifest (JSON,
which kubectl reads as YAML) with one Master and N-1 Worker pods, each running
`python -m phalanx train …` as that node's launcher. The operator tells each pod its
place through torchrun's variables (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR/PORT), which become `--nnodes`, `--nproc-per-node`, `--node-rank` and
`--rdzv-endpoint` (flags given explicitly still win). The operator also sets RANK and
WORLD_SIZE — but to the pod's index and the number of pods, so Phalanx does not read them
as a process's rank there (`envinfo.operator_pod`).

The manifest is checked in the tests against the operator's published API (the models
that Kubeflow's `kubeflow-training` SDK generates from the CRD's OpenAPI schema).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from phalanx.errors import UserError
from phalanx.options import add_config_flags, count, resolve, without_flags

SUMMARY = "Render a Kubeflow PyTorchJob manifest that runs `phalanx train` on N nodes."
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")  # a DNS-1123 label, room for suffixes
NODE_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")
OWN_FLAGS = {"--nodes": True, "--image": True, "--name": True, "--gpus-per-node": True,
             "--volume-claim": True, "--mount-path": True, "--manifest": True}


def operator_dist(environ: dict) -> dict[str, Any]:
    """`[dist]` values from the operator's variables (lowest precedence: a TOML file or a
    flag overrides them)."""
    from phalanx.envinfo import operator_pod

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    g = parser.add_argument_group("kubernetes")
    g.add_argument("--nodes", type=count(1, 100000), default=1, help="pods (default: 1)")
    g.add_argument("--image", required=True, help="container image with phalanx installed")
    g.add_argument("--name", default="phalanx", help="the PyTorchJob's name (default: phalanx)")
    g.add_argument("--gpus-per-node", type=count(0, 64), default=0,
                   help="nvidia.com/gpu per pod (default: 0)")
    g.add_argument("--volume-claim", default=None, metavar="PVC",
                   help="a PersistentVolumeClaim every pod mounts: --out must be on it")
    g.add_argument("--mount-path", default="/phalanx", help="where it is mounted (default: "
                   "/phalanx)")
    g.add_argument("--manifest", default=None, metavar="FILE",
                   help="write the manifest here too (default: print only)")


def manifest(ns: argparse.Namespace, cfg, argv: list[str]) -> dict[str, Any]:
    if not _NAME.match(ns.name):
        raise UserError(f"`--name {ns.name}` is not a Kubernetes name: lower-case letters, "
                        f"digits and '-', at most 52 characters, starting and ending with a "
                        f"letter or digit.")
    procs = ns.gpus_per_node or cfg.dist.nproc_per_node or 1
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds the training container by this name
        "image": ns.image,
        # the operator gives each pod its shape (PET_*): those flags are not repeated
        "command": ["python", "-m", "phalanx", "train", *without_flags(argv, {
            **OWN_FLAGS, **dict.fromkeys(NODE_FLAGS, True)})],
    }
    pod: dict[str, Any] = {"containers": [container]}
    if ns.gpus_per_node:
        # a Kubernetes quantity, which the API types as a string
        container["resources"] = {"limits": {"nvidia.com/gpu": str(ns.gpus_per_node)}}
    if ns.volume_claim:
        mount = ns.mount_path.rstrip("/") or "/"
        if not (cfg.train.out + "/").startswith(mount + "/"):
            raise UserError(f"`--out {cfg.train.out}` is not under `--mount-path {mount}`: "
                            f"every pod must write the same run directory. Use e.g. "
                            f"`--out {mount}/run1`.")
        container["volumeMounts"] = [{"name": "runs", "mountPath": mount}]
        pod["volumes"] = [{"name": "runs",
                           "persistentVolumeClaim": {"claimName": ns.volume_claim}}]
    replica = lambda n: {"replicas": n, "restartPolicy": "OnFailure",  # noqa: E731
                         "template": {"spec": pod}}
    specs = {"Master": replica(1)}
    if ns.nodes > 1:
        specs["Worker"] = replica(ns.nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": ns.name},
            "spec": {"nprocPerNode": str(procs), "pytorchReplicaSpecs": specs,
                     # the schema requires it; "None" keeps finished pods for their logs
                     "runPolicy": {"cleanPodPolicy": "None"}}}


def run_k8s(ns: argparse.Namespace, argv: list[str]) -> int:
    cfg = resolve(ns)
    text = json.dumps(manifest(ns, cfg, argv), indent=2) + "\n"
    if ns.manifest:
        try:
            Path(ns.manifest).expanduser().write_text(text)
        except OSError as exc:
            raise UserError(f"cannot write `{ns.manifest}` (`--manifest`): "
                            f"{exc.strerror}.") from None
    print(text, end="")
    if ns.nodes > 1 and not ns.volume_claim:
        print(f"# note: {ns.nodes} pods write `--out {cfg.train.out}`; give `--volume-claim` "
              f"so that it is storage they share", file=sys.stderr)
    return 0
