"""`--nccl-preset {ethernet,infiniband,debug}`: the NCCL (and torch NCCL) variables the
field guides discuss, set for the workers as a named set, each printed with what it does.

Variables the user exported already are kept (and said so). Presets matter on GPUs with
the nccl backend; on CPU (gloo) they are set but unused, and the launcher says so.
Not in any preset, on purpose: NCCL_P2P_DISABLE=1 (turns off NVLink/PCIe peer-to-peer —
a test for a suspected P2P fault, not a setting), and "NCCL_TIMEOUT", which NCCL does not
read: the collective timeout is the process group's (`--timeout-s`).
"""

from __future__ import annotations

import os

PRESET_NAMES = ("ethernet", "infiniband", "debug")
IFACE = "<the interface towards the rendezvous>"  # filled in from the node plan


def preset(name: str, ifname: str | None) -> list[tuple[str, str, str]]:
    """[(variable, value, what it does)] of preset `name`; `ifname`: the interface this
    machine reaches the others on (several machines), else None."""
    socket_if = [("NCCL_SOCKET_IFNAME", ifname, "the interface NCCL's bootstrap and socket "
                  "transport use (the one this machine reaches the rendezvous on, not "
                  "lo or docker0)")] if ifname else []
    table = {
        "ethernet": [
            ("NCCL_IB_DISABLE", "1", "no InfiniBand/RoCE verbs: TCP sockets only"),
            *socket_if,
            ("NCCL_SOCKET_NTHREADS", "4", "CPU threads per socket connection (faster "
             "links need more than the default)"),
            ("NCCL_NSOCKS_PERTHREAD", "4", "sockets per thread (threads × sockets ≤ 64)"),
        ],
        "infiniband": [
            ("NCCL_IB_DISABLE", "0", "use InfiniBand/RoCE verbs (set NCCL_IB_HCA yourself "
             "to choose adapters, e.g. mlx5_0,mlx5_1)"),
            *socket_if,
        ],
        "debug": [
            ("NCCL_DEBUG", "INFO", "NCCL logs its version, rings/trees and transports"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET", "…limited to start-up and the network chosen"),
            ("NCCL_DEBUG_FILE", "nccl.%h.%p.log", "one log per process (%h host, %p pid) "
             "instead of interleaved output"),
            ("TORCH_FR_BUFFER_SIZE", "2000", "torch's flight recorder keeps the last "
             "2000 collectives per rank"),
            ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000", "…(the same, by its older "
             "name, which older torch releases read)"),
            ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "…and writes them out when a collective "
             "times out (who was waiting on what)"),
        ],
    }
    return table[name]


def apply(name: str | None, ifname: str | None, env: dict[str, str],
          backend_is_nccl: bool) -> list[str]:
    """Add preset `name` to `env` (the workers' variables) where the user has not set
    the variable; return the lines that say what was set, kept, or why it is unused."""
    if not name:
        return []
    lines = []
    for var, value, what in preset(name, ifname):
        if var in os.environ:
            lines.append(f"  {var}={os.environ[var]} (yours, kept; the preset has {value})")
        else:
            env[var] = value
            lines.append(f"  {var}={value}: {what}")
    head = f"NCCL preset `{name}`"
    if not backend_is_nccl:
        head += " (this job runs gloo on CPU: NCCL does not read these)"
    return [head + ":", *lines]
