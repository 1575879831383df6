"""`phalanx train --fault-tolerance torchft` on one machine: the lighthouse, and one
`phalanx train` per replica group (`OUT/replica-G`, one rank each, under torch's elastic
agent with `--max-restarts`), their output on the console prefixed `gG|`.

The groups are started in sessions of their own; a Ctrl-C or SIGTERM reaching this
launcher is marked as a stop of the whole job and forwarded to each group (they stop
after the same step, each committing a checkpoint), and the launcher ends with the usual
exit code (130 / 143)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from phalanx.checkpoint.store import committed_note, latest_committed
from phalanx.cluster import protocol
from phalanx.config.dist import lighthouse_url
from phalanx.config.layout import given, requested, said
from phalanx.config.sections import Config
from phalanx.config.strategy import choose
from phalanx.errors import Interrupted, UserError
from phalanx.ft.publish import publish
from phalanx.paths import RunDir

FORWARDED = (signal.SIGINT, signal.SIGTERM)
# torchft's checkpoint server logs each request it serves (a heal; the heal line says it)
# to stderr, from its own thread: possibly in the middle of another line of the same process
HTTP_LOG = re.compile(r'(?:::ffff:)?\d{1,3}(?:\.\d{1,3}){3} - - \[[^\]\n]*\] '
                      r'"GET /checkpoint/\S+ HTTP/[\d.]+" \d+ \S*\n?')


def check(cfg: Config) -> None:
    """What `--fault-tolerance torchft` cannot do yet, refused before anything starts (the
    verb calls it before it writes anything)."""
    d = cfg.dist
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's servers: no line per quorum (read
    try:  # when torchft is first imported)
        import torchft  # noqa: F401
    except ImportError:
        raise UserError("`--fault-tolerance torchft` needs torchft, which is not installed: "
                        "pip install 'phalanx[ft]'.") from None
    if given(requested(d)):
        raise UserError(f"`--fault-tolerance torchft` with `{said(requested(d))}`: each "
                        f"replica group is one rank with replicated weights, so a group has "
                        f"no mesh to lay out (HSDP inside a group is not built yet). Drop "
                        f"the layout flags.")
    shards = choose(d, group_count(d), cfg.train.grad_accum).spec.shards
    if shards:
        raise UserError(f"`--fault-tolerance torchft` runs one rank per replica group with "
                        f"replicated weights; `--strategy {d.strategy}` shards them (HSDP "
                        f"inside a group is not built yet). Use `--strategy ddp`.")
    if d.node_range()[1] > 1:
        raise UserError("`--fault-tolerance torchft` across machines: start `phalanx train "
                        "--fault-tolerance torchft --lighthouse HOST:PORT` on each machine "
                        "(one shared lighthouse, `torchft_lighthouse`), without `--nnodes`.")
    if d.lighthouse is None and d.min_replicas > group_count(d):  # no other machine's join
        raise UserError(f"`--min-replicas {d.min_replicas}` is more than the "
                        f"{group_count(d)} replica groups this launch starts "
                        f"(`--nproc-per-node`): no step could ever be taken. Lower it, or "
                        f"start more groups.")


def group_name(g: int, shared_lighthouse: bool) -> str:
    """Group g of this machine: `g`, or `HOST-g` when machines share a lighthouse (the
    names are the groups' torchft replica ids and their OUT/replica-NAME folders)."""
    return f"{socket.gethostname()}-{g}" if shared_lighthouse else str(g)


def group_command(argv: list[str], out: Path, name: str, threads: int) -> list[str]:
    """`phalanx train` for one replica group: the user's flags, one rank, its own OUT,
    its share of the cores."""
    return [sys.executable, "-m", "phalanx", "train", *argv, "--nproc-per-node", "1",
            "--threads-per-rank", str(threads), "--out", str(replica_dir(out, name))]


def group_count(dist) -> int:
    """Replica groups on this machine: `--nproc-per-node`, 2 by default."""
    return dist.nproc_per_node or 2


def replica_dir(out: Path, name: str) -> Path:
    """Where replica group NAME's run is: OUT/replica-NAME."""
    return RunDir(out).replica(name)


def run_groups(cfg: Config, argv: list[str], out: Path, threads: int,
               complete: Callable[[Path], bool],
               hand: Callable[[str, list[str]], dict[str, str]]) -> int:
    """Start the lighthouse (unless `--lighthouse`) and the groups, each with `threads`
    torch threads; wait for them all (`check(cfg)` first). A run one group has completed
    (`complete(its folder)`: at `--max-steps`, its outputs written) starts nothing: the
    groups behind it must not train on alone; a higher `--max-steps` or `--resume never`
    is not complete. `hand(name, its command line)`: the variables that hand group NAME
    the job its launcher decided (`phalanx.launch.job`): it parses no command line."""
    groups = group_count(cfg.dist)
    names = [group_name(g, cfg.dist.lighthouse is not None) for g in range(groups)]
    done = next((n for n in names if complete(replica_dir(out, n))), None)
    if done is not None:
        publish(out, done)  # (again: a launcher stopped before it had published it)
        print(f"phalanx: the run is complete: replica group {done} finished it; its result "
              f"is in {out}; nothing to do.", flush=True)
        return 0
    from phalanx.cluster.rendezvous import bound_store

    server = None
    if cfg.dist.lighthouse is not None:
        address = lighthouse_url(cfg.dist.lighthouse)  # HOST:PORT as the URL torchft takes
    else:
        from torchft._torchft import LighthouseServer

        wait_ms = int(cfg.dist.ft_join_timeout_s * 1000)  # for a late group, and a gone one
        server = LighthouseServer(bind="127.0.0.1:0", min_replicas=cfg.dist.min_replicas,
                                  join_timeout_ms=wait_ms, heartbeat_timeout_ms=wait_ms)
        address = "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]  # not its hostname
    # where this launch's groups wait for each other before their first quorum (with a
    # shared lighthouse too: else a group without a checkpoint trains alone from step 1
    # and heals the resumed ones with its weights); the launcher's own, on loopback
    store = bound_store("127.0.0.1", 0)  # (a TCPStore of its own binds every interface)
    start = {protocol.FT_START: f"127.0.0.1:{store.port}:{','.join(names)}"}
    print(f"phalanx: fault tolerance (torchft): {groups} replica groups of 1 rank, "
          f"lighthouse {address}; each group's run in {out}/replica-G", flush=True)
    try:
        groups_ = Groups(names, store, out, whole_job=cfg.dist.lighthouse is None)
        groups_.start(argv, address, threads, start, hand)
        code, winner = groups_.wait(cfg.dist.ft_join_timeout_s + 10)
        if winner is not None:
            files = publish(out, winner)
            print(f"phalanx: the run's result is in {out} ({', '.join(files[:3])}, …, from "
                  f"replica group {winner}); each group's details in {out}/replica-G",
                  flush=True)
        return code
    finally:
        if server is not None:
            server.shutdown()


class Groups:
    """The replica groups' processes, their output pumps, and how they end."""

    KILL_AFTER_S = 30.0  # a group told to stop (SIGTERM) and still there: SIGKILL

    def __init__(self, names: list[str], store, out: Path, whole_job: bool = True) -> None:
        self.names, self.store, self.out = names, store, out
        # its groups are the whole job (its own lighthouse): a stop it is sent stops the
        # job; with a shared lighthouse other machines' groups go on (as a failure)
        self.whole_job = whole_job
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        self.signals: list[int] = []
        self.marked: set[str] = set()  # groups marked as ended in the store
        self.winner: str | None = None  # the group that finished the run

    def start(self, argv: list[str], address: str, threads: int, start: dict[str, str],
              hand: Callable[[str, list[str]], dict[str, str]]) -> None:
        for name in self.names:
            command = group_command(argv, self.out, name, threads)
            env = {**os.environ, protocol.FT_GROUP: name, protocol.FT_LIGHTHOUSE: address,
                   protocol.LAUNCHER_PID: str(os.getpid()), "PYTHONUNBUFFERED": "1", **start,
                   **hand(name, command[3:])}
            proc = subprocess.Popen(command, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            prefix = f"g{name}| " if name.isdigit() else f"{name}| "  # (HOST-G: as it is)
            pump = threading.Thread(target=_pump, args=(proc, prefix), daemon=True)
            pump.start()
            self.procs.append(proc)
            self.pumps.append(pump)

    def wait(self, grace_s: float) -> tuple[int, str | None]:
        """The exit code and the group that finished the run (None: none did); 0 once
        a group has finished the run (the others, behind it, are stopped
        `grace_s` later: a group that trained on alone after the others finished would
        hold another run). Each stop signal is forwarded to every group (a second one
        stops them at once, as it does a run without torchft)."""
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        finished: float | None = None
        told: float | None = None
        try:
            while any(proc.poll() is None for proc in self.procs):
                self._mark_ended()
                now = time.monotonic()
                if finished is None and any(proc.poll() == 0 for proc in self.procs):
                    finished = now
                elif finished is not None and told is None and now - finished > grace_s:
                    self._send(signal.SIGTERM)
                    told = now
                elif told is not None and now - told > self.KILL_AFTER_S:
                    self._send(signal.SIGKILL)
                time.sleep(0.1)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for pump in self.pumps:  # every group's last lines before the launcher's own
            pump.join(timeout=10)
        return _outcome([proc.returncode for proc in self.procs], self.signals, self.names,
                        [replica_dir(self.out, name) for name in self.names], self.winner)

    def _forward(self, signum: int, frame: object) -> None:
        """A stop of the whole job: marked first (the groups then stop after the same
        step, see replica.ReplicaGroup.average), then forwarded. With a shared lighthouse
        it is not marked: this machine's groups leave, the other machines' go on."""
        self.signals.append(signum)
        if self.whole_job:
            from phalanx.ft.replica import StartStore

            self.store.set(StartStore.STOP, str(signum))
        self._send(signum)

    def _send(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def _mark_ended(self) -> None:
        """A group that ended is no longer waited for by the others' start (see
        replica.StartStore.meet). The group that took the last step marked the run finished
        (or, unmarked, the first that ended with 0): a group behind it ends at its next
        step (replica.ReplicaGroup.begin_step) and the outcome names the winner."""
        from phalanx.ft.replica import StartStore, started_key

        for name, proc in zip(self.names, self.procs):
            if name not in self.marked and proc.poll() is not None:
                if proc.poll() == 0 and self.winner is None:  # (its last step marked it)
                    if not self.store.check([StartStore.FINISHED]):
                        self.store.set(StartStore.FINISHED, name)  # (before its start mark)
                    self.winner = self.store.get(StartStore.FINISHED).decode()
                self.store.set(started_key(name), "ended")
                self.marked.add(name)


def _pump(proc: subprocess.Popen, prefix: str) -> None:
    assert proc.stdout is not None
    for line in without_access_logs(proc.stdout):
        sys.stdout.write(prefix + line)
        sys.stdout.flush()


def without_access_logs(lines):
    """The lines with torchft's access-log entries cut out; a line such an entry broke
    in two (it ended the line's first part) is joined again."""
    carry = ""
    for line in lines:
        kept = carry + HTTP_LOG.sub("", line)
        carry = ""
        if not kept:
            continue
        if not kept.endswith("\n") and line.endswith("\n"):  # the rest follows
            carry = kept
            continue
        yield kept
    if carry:
        yield carry + "\n"


def _outcome(codes: list[int], got: list[int], names: list[str],
             folders: list[Path], first: str | None = None) -> tuple[int, str | None]:
    """The launcher's exit code (or Interrupted) and the group that finished the run,
    from the groups' exit codes, the stop signals it got and the groups' run directories (`first`: the group seen ending with 0
    first; a group behind it ends with 0 too, with nothing left to train)."""
    winners = sorted((names[g] for g, code in enumerate(codes) if code == 0),
                     key=lambda name: name != first)
    if got and not winners:
        raise Interrupted(got[0], f"stopped by {signal.Signals(got[0]).name}: "
                          + _kept(codes, names, folders))
    if winners:
        behind = [names[g] for g, code in enumerate(codes) if code != 0]
        note = f" (stopped behind it: group {', '.join(map(str, behind))})" if behind else ""
        print(f"phalanx: replica group {winners[0]} finished the run{note}", flush=True)
        return 0, winners[0]
    print("phalanx: " + ", ".join(f"replica group {names[g]} exited with code {c}"
                                  for g, c in enumerate(codes)), file=sys.stderr, flush=True)
    return (2 if all(c == 2 for c in codes) else 1), None


def _kept(codes: list[int], names: list[str], folders: list[Path]) -> str:
    """What the stopped groups keep, as each group's own last line says it (read from
    their run directories), and how to go on."""
    kept = {p.name if p is not None else None for p in map(latest_committed, folders)}
    if all(code in (130, 143, 138) for code in codes) and len(kept) == 1:
        name = kept.pop()
        return (f"checkpoint {name} is committed in every replica group; run the same "
                f"command to resume." if name is not None else "no replica group had "
                "committed a checkpoint yet; the same command starts the run again.")
    return ", ".join(f"replica group {name} exited with code {code} "
                     f"({committed_note(folder)})"
                     for name, code, folder in zip(names, codes, folders)) + \
        "; run the same command to resume from the groups' checkpoints."
