"""A real SLURM cluster for tests: munged, slurmctld and slurmd from Debian's `slurm-wlm` +
`munge`, with a generated `slurm.conf` (CPUs, memory; one partition) in a temporary
directory. `.ci/run` installs the packages; elsewhere the tests that need it skip with the
reason.

`Cluster`: one host, this machine (tests/e2e/test_slurm.py).

`MultiHostCluster`: several hosts made as Linux network namespaces
(tests/e2e/test_slurm_multihost.py). A namespace `ctl` holds a bridge (10.79.0.254) and
slurmctld — it is also the "login node" the tests run srun/sbatch/scontrol in
(`cluster.cmd`); each host `h1`, `h2`, ... is a namespace joined to the bridge by a veth
pair (10.79.0.1, 10.79.0.2, ...) with its own host name (`unshare --uts`) and one
`slurmd -N hK` (`NodeName=hK NodeAddr=10.79.0.K`; its own spool, pid file and log through
`%n`; the same SlurmdPort, as the addresses differ). Names resolve through
`/etc/netns/NS/hosts`, which `ip netns exec` mounts over /etc/hosts. munge's socket is a
path, shared by all. The filesystem is shared, as on a cluster. Nothing is added to the
root namespace's network. `stop` kills every process left in the namespaces, deletes them
and their /etc/netns directories, even after a failed start.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from runs import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")
MUNGE_PID = Path("/run/munge/munged.pid")
UP = ("idle", "mix", "alloc")


def missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    absent = [d for d in DAEMONS if not (shutil.which(d) or Path(f"/usr/sbin/{d}").exists())]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} missing): "
                f"apt-get install slurm-wlm munge (as .ci/run does)")
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd for a test needs root"
    return None


def netns_missing() -> str | None:
    """Why hosts cannot be made as network namespaces here, or None."""
    if not (shutil.which("ip") and shutil.which("unshare")):
        return "iproute2 (`ip`) or util-linux (`unshare`) is missing: no `ip netns` hosts"
    probe = f"pxprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024
    return 1024


def _kill(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, sig)
    except (OSError, ValueError):
        pass


def _pid_of(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


MUNGE_SOCKET = Path("/run/munge/munge.socket.2")


def start_munge() -> bool:
    """Start munged unless one runs (and answers: its socket is there); True when this
    call started it. Waits for its socket."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0 \
            and MUNGE_SOCKET.exists():
        return False
    _wait_gone("munged", 10.0)  # one still shutting down would remove the new socket
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "/usr/sbin/munged"], check=True)
    deadline = time.monotonic() + 10
    while not MUNGE_SOCKET.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def stop_munge() -> None:
    """Stop the munged this process started (by its pid file, not by name), and wait
    until it has exited (a cluster started next must not find it half-gone)."""
    pid = _pid_of(MUNGE_PID)
    if pid:
        _kill(pid)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def _wait_gone(name: str, limit_s: float) -> None:
    """Wait until no process named `name` runs (at most `limit_s`)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and \
            subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0:
        time.sleep(0.1)


def common_conf(root: Path, controller: str, slurmd_port: int, ctld_port: int,
                daemon_files: str = "slurmd") -> list[str]:
    """The slurm.conf lines every test cluster shares; `daemon_files` names slurmd's pid
    and log files (`slurmd-%n` for several slurmd on one machine)."""
    r = root
    spool = f"{r}/spool/%n" if "%n" in daemon_files else f"{r}/spool"
    return ["ClusterName=phalanx-test", f"SlurmctldHost={controller}", "AuthType=auth/munge",
            "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={spool}", f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/{daemon_files}.pid", f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/{daemon_files}.log", f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}", "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "MpiDefault=none", "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none", "KillWait=5"]


class Cluster:
    """One host: slurmctld and slurmd on this machine."""

    def __init__(self, root: Path) -> None:
        self.root, self.host = root, socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.started_munge = False

    def cmd(self, argv: list[str]) -> list[str]:
        """`argv` as run where the cluster's clients (srun, sbatch, scontrol) work."""
        return list(argv)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.cmd(argv), env=kwargs.pop("env", self.env), **kwargs)

    def write_conf(self) -> None:
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text("\n".join([
            *common_conf(self.root, self.host, free_port(), free_port()),
            f"NodeName={self.host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} "
            f"State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP "
            f"OverSubscribe=YES", ""]))

    def start(self) -> None:
        self.write_conf()
        self.started_munge = start_munge()
        for daemon, extra in (("slurmctld", ["-i"]), ("slurmd", [])):
            subprocess.run([f"/usr/sbin/{daemon}", "-f", str(self.conf), *extra],
                           env=self.env, check=True)
        self.wait_up()

    def job_state(self, job: str) -> tuple[str, str]:
        """(JobState, Reason) of `job` as scontrol shows it; ("?", "") when it shows none."""
        shown = self.run(["scontrol", "show", "job", job]).stdout
        state = shown.split("JobState=")[1].split()[0] if "JobState=" in shown else "?"
        reason = shown.split("Reason=")[1].split()[0] if "Reason=" in shown else ""
        return state, reason

    def node_states(self) -> dict[str, str]:
        """{node: state} as sinfo says (`idle`, `down*`, ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_up(self, timeout: float = 60) -> None:
        deadline, states = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(s in UP for s in states.values()):
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-1500:] for p in (self.root / "log").iterdir()}
        raise RuntimeError(f"SLURM did not come up (nodes: {states}): {logs}")

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld"):
            pid = _pid_of(self.root / f"{name}.pid")
            if pid:
                _kill(pid)
        if self.started_munge:
            stop_munge()


class MultiHostCluster(Cluster):
    """`hosts` SLURM nodes h1..hN, each a network namespace with its own slurmd, and
    slurmctld in a namespace of its own (also where the clients run: `cmd`)."""

    SUBNET, PORT = "10.79.0", 6818

    def __init__(self, root: Path, hosts: int = 2) -> None:
        super().__init__(root)
        tag = uuid.uuid4().hex[:6]
        self.tag, self.ctl = tag, f"pxc{tag}"
        self.nodes = {f"h{k}": f"{self.SUBNET}.{k}" for k in range(1, hosts + 1)}
        self.ns = {node: f"px{node}{tag}" for node in self.nodes}
        self.controller = f"{self.SUBNET}.254"
        self.slurmd: dict[str, subprocess.Popen] = {}
        self.slurmctld: subprocess.Popen | None = None
        self._log = None

    def cmd(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ctl, *argv]

    def on(self, node: str, argv: list[str]) -> list[str]:
        """`argv` run on host `node` (its namespace and host name)."""
        # not `ip netns exec`: it mounts a fresh /sys, without the cgroup mounts slurmd needs
        hosts = shlex.quote(f"{self.root}/hosts")
        line = f"mount --bind {hosts} /etc/hosts && hostname {shlex.quote(node)} && exec \"$@\""
        return ["nsenter", f"--net=/run/netns/{self.ns[node]}", "unshare", "--mount",
                "--uts", "sh", "-c", line, "sh", *argv]

    def _network(self) -> None:
        ip = lambda *args: subprocess.run(["ip", *args], check=True,  # noqa: E731
                                          capture_output=True)
        br = f"pxbr{self.tag}"
        ip("netns", "add", self.ctl)
        ip("-n", self.ctl, "link", "add", br, "type", "bridge")
        ip("-n", self.ctl, "addr", "add", f"{self.controller}/24", "dev", br)
        for dev in (br, "lo"):
            ip("-n", self.ctl, "link", "set", dev, "up")
        for k, (node, address) in enumerate(self.nodes.items(), 1):
            ns, here, there = self.ns[node], f"pxv{k}{self.tag}", f"pxp{k}{self.tag}"
            ip("netns", "add", ns)
            ip("-n", self.ctl, "link", "add", here, "type", "veth", "peer", "name", there)
            ip("-n", self.ctl, "link", "set", there, "netns", ns)
            ip("-n", self.ctl, "link", "set", here, "master", br)
            ip("-n", self.ctl, "link", "set", here, "up")
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", there)
            for dev in (there, "lo"):
                ip("-n", ns, "link", "set", dev, "up")
        hosts = "\n".join(["127.0.0.1 localhost", f"{self.controller} {self.host}",
                           *(f"{a} {n}" for n, a in self.nodes.items()), ""])
        (self.root / "hosts").write_text(hosts)  # mounted over /etc/hosts on the hosts
        Path(f"/etc/netns/{self.ctl}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{self.ctl}/hosts").write_text(hosts)  # `ip netns exec` mounts it

    def write_conf(self) -> None:
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(exist_ok=True)
        names = ",".join(self.nodes)
        self.conf.write_text("\n".join([
            *common_conf(self.root, f"{self.host}({self.controller})", self.PORT, 6817,
                         "slurmd-%n"),
            # a lost host is declared DOWN after SlurmdTimeout; its jobs are requeued
            "SlurmdTimeout=10", "MessageTimeout=5", "InactiveLimit=0",
            *(f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={os.cpu_count()} "
              f"RealMemory={_memory_mb() // len(self.nodes)} State=UNKNOWN"
              for n, a in self.nodes.items()),
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP "
            f"OverSubscribe=YES", ""]))

    def start(self) -> None:
        try:
            self._network()
            self.write_conf()
            self.started_munge = start_munge()
            self.slurmctld = subprocess.Popen(
                self.cmd(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)]),
                env=self.env, stdout=self.log(), stderr=subprocess.STDOUT)
            for node in self.nodes:
                self.start_slurmd(node)
            self.wait_up()
        except BaseException:
            self.stop()
            raise

    def start_slurmd(self, node: str) -> None:
        """(Re)start host `node`'s slurmd, in the foreground of a process of ours."""
        self.slurmd[node] = subprocess.Popen(
            self.on(node, ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)]),
            env=self.env, stdout=self.log(), stderr=subprocess.STDOUT)

    def log(self):
        """The daemons' shared output file (opened once, closed by `stop`)."""
        if self._log is None:
            self._log = open(self.root / "log" / "daemons.out", "a")  # noqa: SIM115
        return self._log

    def revive(self, node: str) -> None:
        """Host `node` is back: its link up, its slurmd started (it registers again)."""
        self.link(node, up=True)
        self.start_slurmd(node)

    def pids(self, node: str) -> list[int]:
        """Every process in host `node`'s namespace (its slurmd, slurmstepd, tasks)."""
        out = subprocess.run(["ip", "netns", "pids", self.ns[node]], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]

    def link(self, node: str, up: bool) -> None:
        """Connect host `node` to the bridge, or cut it off (nothing it sends arrives)."""
        k = list(self.nodes).index(node) + 1
        subprocess.run(["ip", "-n", self.ctl, "link", "set", f"pxv{k}{self.tag}",
                        "up" if up else "down"], check=True, capture_output=True)

    def lose(self, node: str, silent: bool = False) -> list[int]:
        """Host `node` is gone: every process on it killed at once (SIGKILL). `silent`: its
        link is cut first, so that no reset of its connections reaches the others (a
        machine that loses power); else its kernel resets them (the processes die, the
        machine stays). The pids killed."""
        if silent:
            self.link(node, up=False)
        pids: list[int] = []
        for _ in range(50):  # again until none is left (one may fork while we kill)
            found = self.pids(node)
            if not found:
                break
            for pid in found:
                _kill(pid, signal.SIGKILL)
            pids += [p for p in found if p not in pids]
            time.sleep(0.02)
        if node in self.slurmd:
            self.slurmd.pop(node).wait(timeout=10)
        return pids

    def stop(self) -> None:
        for proc in [*self.slurmd.values(), self.slurmctld]:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in [*self.slurmd.values(), self.slurmctld]:
            try:
                proc is not None and proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in (*self.ns.values(), self.ctl):
            if Path(f"/run/netns/{ns}").exists():
                out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                     text=True).stdout
                for pid in out.split():
                    _kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.started_munge:
            stop_munge()
