"""Kubernetes through Kubeflow's training operator (PyTorchJob, kubeflow.org/v1).

`phalanx k8s [train options] --nodes N --image IMG` renders a PyTorchJob manifest (YAML)
with one Master and N-1 Worker pods, each running `python -m phalanx train …` as that
node's launcher, with CPU and memory requests and a memory-backed /dev/shm (the
container runtime's default is 64 MiB; NCCL and DataLoader workers use shared memory).
`phalanx k8s [run options] --nodes N --image IMG run SCRIPT [ARGS...]` runs
`python -m phalanx run … SCRIPT ARGS` instead (`cluster_job`): SCRIPT is a path inside the
container (in the image, or on the mounted volume), so it is not looked for here.
The operator tells each pod its place through torchrun's variables (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR/PORT), which become `--nnodes`, `--nproc-per-node`, `--node-rank` and
`--rdzv-endpoint` (flags given explicitly still win). The operator also sets RANK and
WORLD_SIZE — but to the pod's index and the number of pods, so Phalanx does not read them
as a process's rank there (`envinfo.operator_pod`).

The manifest is checked in the tests against the operator's published API (the models
that Kubeflow's `kubeflow-training` SDK generates from the CRD's OpenAPI schema). Every
value is checked first: an image reference, a PVC name (a DNS-1123 subdomain), an
absolute mount path and Kubernetes quantities, or a one-line error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from phalanx.cli.cluster_job import add_job_argument, check_value, job_of, layout_note, show
from phalanx.config.flags import add_config_flags, count, resolve
from phalanx.errors import UserError
from phalanx.paths import atomic_write

SUMMARY = ("Render a Kubeflow PyTorchJob manifest that runs `phalanx train` (or, with `run "
           "SCRIPT`, your script under `phalanx run`) on N nodes.")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?")  # a DNS-1123 label, room for suffixes
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")  # a PVC's name
_HOST = r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
_PATH = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(  # the reference grammar of docker's distribution/reference
    rf"({_HOST}(:[0-9]+)?/)?{_PATH}(/{_PATH})*(:\w[\w.-]{{0,127}})?"
    r"(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)
_QUANTITY = re.compile(r"([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHM = "/dev/shm"
NODE_FLAGS = ("--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint")
OWN_FLAGS = {"--nodes": True, "--image": True, "--name": True, "--gpus-per-node": True,
             "--volume-claim": True, "--mount-path": True, "--manifest": True,
             "--cpu-request": True, "--memory-request": True}


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
    g.add_argument("--cpu-request", default=None, metavar="QUANTITY",
                   help="CPU each pod requests, a Kubernetes quantity such as 8 or 500m "
                        "(default: --threads-per-rank, else 1, per rank)")
    g.add_argument("--memory-request", default=None, metavar="QUANTITY",
                   help="memory each pod requests, a Kubernetes quantity such as 32Gi "
                        "(default: 4Gi per rank)")
    g.add_argument("--manifest", default=None, metavar="FILE",
                   help="write the manifest here too (default: print only)")
    add_job_argument(parser, "SCRIPT is the path inside the container (in the image, or "
                     "under --mount-path on --volume-claim), relative to the image's working "
                     "directory unless absolute; it is not looked for here.")


def check_values(ns: argparse.Namespace) -> None:
    """Every value of the manifest that Kubernetes would refuse (or pull as nothing),
    refused here in one line."""
    check_value(_NAME, "--name", ns.name, "a Kubernetes name: lower-case letters, digits "
                "and '-', at most 52 characters, starting and ending with a letter or digit.")
    if not ns.image.strip():
        raise UserError("`--image` is empty: give the container image that has phalanx "
                        "installed, e.g. `--image registry.example.com/team/phalanx:1.0`.")
    check_value(_IMAGE, "--image", ns.image, "an image reference: expected "
                "[REGISTRY/]PATH[:TAG][@DIGEST] with a lower-case path, e.g. "
                "`--image registry.example.com/team/phalanx:1.0`.")
    if ns.volume_claim is not None:
        check_value(_SUBDOMAIN, "--volume-claim", ns.volume_claim, "a PersistentVolumeClaim "
                    "name: lower-case letters, digits, '-' and '.', at most 253 characters, "
                    "starting and ending with a letter or digit (a DNS-1123 subdomain), e.g. "
                    "`--volume-claim runs`.")
    mount = ns.mount_path.rstrip("/")
    if not ns.mount_path.startswith("/") or _CONTROL.search(ns.mount_path) or not mount \
            or (mount + "/").startswith(SHM + "/"):
        raise UserError(f"`--mount-path {show(ns.mount_path)}` is not a directory a volume "
                        f"can be mounted at: expected an absolute path other than `/` and "
                        f"`{SHM}`, e.g. `--mount-path /phalanx`.")
    for flag, value in (("--cpu-request", ns.cpu_request),
                        ("--memory-request", ns.memory_request)):
        if value is not None:
            check_value(_QUANTITY, flag, value, "a Kubernetes quantity: expected a number "
                        "with an optional suffix (m, k, M, G, Ki, Mi, Gi, …), e.g. "
                        "`--cpu-request 8`, `--cpu-request 500m`, `--memory-request 32Gi`.")


def manifest(ns: argparse.Namespace, cfg, argv: list[str]) -> dict[str, Any]:
    """The PyTorchJob of the `phalanx k8s` command line `argv` (after the verb)."""
    job = job_of(ns, argv, "k8s")
    check_values(ns)
    procs = ns.gpus_per_node or cfg.dist.nproc_per_node or 1
    container: dict[str, Any] = {
        "name": "pytorch",  # the operator finds the training container by this name
        "image": ns.image,
        # the operator gives each pod its shape (PET_*): those flags are not repeated
        "command": job.command("python", {**OWN_FLAGS, **dict.fromkeys(NODE_FLAGS, True)}, []),
        "resources": _resources(ns, cfg, procs),
        "volumeMounts": [{"name": "shm", "mountPath": SHM}],
    }
    # the container runtime's /dev/shm is 64 MiB: NCCL and DataLoader workers need more
    pod: dict[str, Any] = {"containers": [container],
                           "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}
    if ns.volume_claim:
        mount = ns.mount_path.rstrip("/")
        if not (cfg.train.out + "/").startswith(mount + "/"):
            raise UserError(f"`--out {cfg.train.out}` is not under `--mount-path {mount}`: "
                            f"every pod must write the same run directory. Use e.g. "
                            f"`--out {mount}/run1`.")
        container["volumeMounts"].append({"name": "runs", "mountPath": mount})
        pod["volumes"].append({"name": "runs",
                               "persistentVolumeClaim": {"claimName": ns.volume_claim}})
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


def _resources(ns: argparse.Namespace, cfg, procs: int) -> dict[str, Any]:
    """Requests (a pod without them is the first evicted), no CPU or memory limits (a CPU
    limit throttles the ranks; the memory-backed /dev/shm counts against a memory one).
    Quantities are strings in the API."""
    cpu = ns.cpu_request or str(procs * (cfg.dist.threads_per_rank or 1))
    out: dict[str, Any] = {"requests": {"cpu": cpu,
                                        "memory": ns.memory_request or f"{4 * procs}Gi"}}
    if ns.gpus_per_node:
        out["limits"] = {"nvidia.com/gpu": str(ns.gpus_per_node)}
    return out


_YAML_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "none"}


def to_yaml(value: Any) -> str:
    """Block-style YAML of the manifest (dicts, lists, strings, ints). A string is plain
    only when no YAML reader (1.1 or 1.2) can take it for anything else; otherwise it is
    written as a JSON string, which is a YAML double-quoted scalar."""
    return "\n".join(_yaml_lines(value, 0)) + "\n"


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and _YAML_PLAIN.fullmatch(value) and \
            value.lower() not in _YAML_WORDS:
        return value
    return json.dumps(value)  # also {} and [] (flow style)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad, lines = " " * indent, []
    nested = lambda v: isinstance(v, (dict, list)) and v  # noqa: E731
    if isinstance(value, dict):
        for key, item in value.items():
            if nested(item):
                lines += [f"{pad}{_yaml_scalar(key)}:", *_yaml_lines(item, indent + 2)]
            else:
                lines.append(f"{pad}{_yaml_scalar(key)}: {_yaml_scalar(item)}")
    else:
        for item in value:
            inner = _yaml_lines(item, indent + 2) if nested(item) else \
                [f"{pad}  {_yaml_scalar(item)}"]
            lines += [f"{pad}- {inner[0].lstrip()}", *inner[1:]]
    return lines


def run_k8s(ns: argparse.Namespace, argv: list[str]) -> int:
    job = job_of(ns, argv, "k8s")  # its errors first: a trainer flag given with `run`
    cfg = resolve(ns)
    spread = layout_note(cfg, ns.nodes, ns.gpus_per_node or cfg.dist.nproc_per_node or 1)
    text = ("# Rendered by `phalanx k8s`: a Kubeflow PyTorchJob; `kubectl apply -f` it.\n"
            + to_yaml(manifest(ns, cfg, argv)))
    if ns.manifest:
        try:
            # as `phalanx slurm --script`: written whole, a link at the name replaced
            atomic_write(Path(ns.manifest).expanduser(), text)
        except OSError as exc:
            raise UserError(f"cannot write `{ns.manifest}` (`--manifest`): "
                            f"{exc.strerror}.") from None
    print(text, end="")
    if ns.nodes > 1 and not ns.volume_claim:
        print(f"# note: {ns.nodes} pods write `--out {cfg.train.out}`; give `--volume-claim` "
              f"so that it is storage they share", file=sys.stderr)
    if spread:
        print(f"# note: {spread}", file=sys.stderr)
    if job.script is not None and not job.script.startswith("/"):
        print(f"# note: `{show(job.script)}` is read inside the container, relative to the "
              f"image's working directory: it must be in the image (or give its path on the "
              f"volume)", file=sys.stderr)
    return 0
