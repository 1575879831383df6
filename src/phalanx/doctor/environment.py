"""Environment checks: versions, backends, devices, the launcher and its variables, and
network advice for the situation found."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from phalanx.cluster import protocol
from phalanx.doctor.checks import Check

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def local_facts() -> dict:
    """What one rank sees (gathered to rank 0)."""
    cuda = torch.cuda.is_available()
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "env": {k: os.environ.get(k) for k in ENV_VARS},
            "launcher": _launcher(), "cuda": cuda,
            "gpus": torch.cuda.device_count() if cuda else 0,
            "device": str(torch.cuda.current_device()) if cuda else "cpu",
            "infiniband": Path("/sys/class/infiniband").is_dir() and
            any(Path("/sys/class/infiniband").iterdir()),
            "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}


def _launcher() -> str:
    e = os.environ
    if e.get(protocol.LAUNCHED):
        return "phalanx"
    if "TORCHELASTIC_RUN_ID" in e:
        return "torchrun"
    if "SLURM_PROCID" in e:
        return "slurm"
    if "KUBERNETES_SERVICE_HOST" in e:
        return "kubernetes"
    return "env" if "RANK" in e else "none"


def versions(backend: str) -> list[Check]:
    nccl = dist.is_nccl_available()
    nccl_version = ".".join(map(str, torch.cuda.nccl.version())) if nccl and \
        torch.cuda.is_available() else "n/a"
    checks = [
        Check("environment", "python / torch", "pass",
              f"Python {platform.python_version()}, torch {torch.__version__}"),
        Check("environment", "backends", "pass" if dist.is_gloo_available() else "fail",
              f"gloo {'yes' if dist.is_gloo_available() else 'no'}, nccl "
              f"{'yes (' + nccl_version + ')' if nccl else 'no'}; this job uses {backend}",
              "" if dist.is_gloo_available() else "install a torch build with gloo"),
    ]
    if torch.cuda.is_available():
        checks.append(Check("environment", "CUDA", "pass",
                            f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
                            f"{torch.cuda.get_device_name(0)}"))
    else:
        checks.append(Check("environment", "CUDA", "pass", "no GPU visible: CPU ranks with gloo"))
    return checks


def launch_checks(facts: list[dict]) -> list[Check]:
    """Launcher variables agree with each other; ranks map to distinct devices."""
    n = len(facts)
    problems = []
    for r, f in enumerate(facts):
        e = f["env"]
        if e["RANK"] is not None and int(e["RANK"]) != r:
            problems.append(f"rank {r} has RANK={e['RANK']}")
        if e["WORLD_SIZE"] is not None and int(e["WORLD_SIZE"]) != n:
            problems.append(f"rank {r} has WORLD_SIZE={e['WORLD_SIZE']}, the group has {n}")
    addrs = {(f["env"]["MASTER_ADDR"], f["env"]["MASTER_PORT"]) for f in facts}
    if len(addrs) > 1:
        problems.append(f"MASTER_ADDR/PORT differ between ranks: {sorted(map(str, addrs))}")
    launchers = sorted({f["launcher"] for f in facts})
    checks = [Check("environment", "launcher", "fail" if problems else "pass",
                    "; ".join(problems) or f"{', '.join(launchers)}: RANK, LOCAL_RANK, "
                    f"WORLD_SIZE={n}, MASTER_ADDR/PORT agree on every rank",
                    "let one launcher set every variable" if problems else "")]
    placed: dict[tuple, list[int]] = {}
    for r, f in enumerate(facts):
        placed.setdefault((f["host"], f["device"]), []).append(r)
    shared = {k: v for k, v in placed.items() if len(v) > 1 and k[1] != "cpu"}
    mapping = ", ".join(f"rank {r}→{f['host']}:{'cuda:' + f['device'] if f['cuda'] else 'cpu'}"
                        for r, f in enumerate(facts))
    checks.append(Check(
        "environment", "LOCAL_RANK → device", "fail" if shared else "pass",
        (f"ranks {list(shared.values())[0]} share one GPU" if shared else mapping),
        "one process per GPU: --nproc-per-node ≤ GPUs, device = cuda:LOCAL_RANK"
        if shared else ""))
    return checks


def network_advice(facts: list[dict], backend: str) -> list[Check]:
    hosts = {f["host"] for f in facts}
    set_vars = ", ".join(f"{k}={v}" for k, v in sorted(facts[0]["nccl_env"].items())) or "none"
    if backend != "nccl":
        text = ("gloo on CPU: NCCL_* settings do not apply. Across machines, "
                "GLOO_SOCKET_IFNAME=<iface> picks the network interface.")
    elif len(hosts) == 1:
        text = ("one machine: NCCL uses NVLink/PCIe peer-to-peer. NCCL_P2P_DISABLE=1 only to "
                "test a suspected P2P fault; NCCL_DEBUG=INFO shows the transport chosen.")
    elif facts[0]["infiniband"]:
        text = ("InfiniBand found: NCCL_IB_HCA=<hca list> to choose adapters, "
                "NCCL_NET_GDR_LEVEL for GPUDirect RDMA; NCCL_DEBUG=INFO "
                "NCCL_DEBUG_SUBSYS=INIT,NET shows what NCCL picked.")
    else:
        text = ("Ethernet between machines: NCCL_SOCKET_IFNAME=<iface> (not lo/docker), "
                "NCCL_IB_DISABLE=1 when there is no InfiniBand; NCCL_DEBUG=INFO to see the "
                "transport.")
    return [Check("network", "NCCL / network settings", "pass",
                  f"{text} NCCL_* set now: {set_vars}.")]
