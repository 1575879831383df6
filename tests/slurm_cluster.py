"""A real single-host SLURM cluster for tests: munged, slurmctld and slurmd from Debian's
`slurm-wlm` + `munge`, with a generated `slurm.conf` (this host's name, CPUs, memory; one
partition) in a temporary directory. `.ci/run` installs the packages; elsewhere the tests
that need it skip with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")


def missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    absent = [d for d in DAEMONS if not (shutil.which(d) or Path(f"/usr/sbin/{d}").exists())]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} missing): "
                f"apt-get install slurm-wlm munge (as .ci/run does)")
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd for a test needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024
    return 1024


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root, self.host = root, socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.started_munge = False

    def write_conf(self) -> None:
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=phalanx-test", f"SlurmctldHost={self.host}", "AuthType=auth/munge",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool", f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid", f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log", f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none", "KillWait=5",
            f"NodeName={self.host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} "
            f"State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP "
            f"OverSubscribe=YES", ""]))

    def start(self) -> None:
        self.write_conf()
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"],
                           check=True)
            self.started_munge = True
        for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", [])):
            subprocess.run([f"/usr/sbin/{daemon}", "-f", str(self.conf), *extra],
                           env=self.env, check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env,
                                 capture_output=True, text=True)
            if out.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"SLURM did not come up: {(self.root / 'log').iterdir()}")

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld"):
            pid_file = self.root / f"{name}.pid"
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        if self.started_munge:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)
