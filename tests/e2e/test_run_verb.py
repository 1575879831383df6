"""`phalanx run SCRIPT` (issue 27): a user's own script on 2 gloo ranks through the one
launch path — a run directory held by one run at a time, quiet ranks, the watchdog,
events and a report; a failing rank's exception shown once; a bad script refused up
front; the same verb as a worker under torchrun; a rank killed under --max-restarts and
Ctrl-C, each continued from the script's newest committed checkpoint."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

PLAIN = """import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
print(f"rank {rank}: {t.tolist()} in {os.environ['PHALANX_RUN_DIR']} with {sys.argv[1:]}",
      flush=True)
dist.destroy_process_group()
"""

RAISES = """import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2)
for step in range(1, 100):
    if dist.get_rank() == 0 and step == 3:
        open("raised-at", "w").write(repr(time.time()))
        raise ValueError(f"my script's own bug at step {step}")
    dist.all_reduce(t)
"""

WAITS = """import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""

# the README's loop on the Run API, saving every step; TOTAL steps, rank 1 SIGKILLed once
# after step KILL_AT (before its save), the final weights in OUT/final.pt
RESUMES = """import os, signal
import torch
import phalanx

total, kill_at = int(os.environ["TOTAL"]), int(os.environ.get("KILL_AT", "0"))
run = phalanx.init(seed=0)
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=g),
                                      torch.randn(40, 1, generator=g))
model, opt = run.setup(torch.nn.Linear(4, 1), lambda p: torch.optim.SGD(p, lr=0.05))
loader = run.loader(data, batch_size=4)
step = run.resume(run.out / "checkpoints", model, opt, loader=loader)
while step < total:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        run.log(step, loss=loss.item())
        print(f"step {step}", flush=True)
        if step == kill_at and run.rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        run.save(run.out / "checkpoints", step, model, opt, loader=loader)
        if step >= total:
            break
weights = run.full_state_dict(model)
if run.is_main:
    torch.save(weights, run.out / "final.pt")
"""

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def phalanx_run(cwd: Path, *args: str, timeout: float = 120, launcher: tuple = (),
                env: dict | None = None) -> subprocess.CompletedProcess:
    command = list(launcher) or [sys.executable]
    return subprocess.run([*command, "-m", "phalanx", "run", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env={**ENV, **(env or {})})


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def test_a_script_without_phalanx_init_runs_with_quiet_ranks(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    done = phalanx_run(tmp_path, "--nproc-per-node", "2", script.name, "a", "--b")
    assert done.returncode == 0, done.stderr[-3000:]
    [out] = (tmp_path / "runs").iterdir()  # the default: a new runs/run-<time>
    assert out.name.startswith("run-") and f"go to {out.resolve()}/" in done.stderr
    said = f"[8.0, 8.0] in {out.resolve()} with ['a', '--b']"
    assert f"rank 0: {said}" in done.stdout and "rank 1" not in done.stdout  # rank 1: its log
    logs = out / "logs"
    assert (logs / "rank-0.log").read_text().startswith("=== rank 0 on ")
    assert f"rank 1: {said}" in (logs / "rank-1.log").read_text()
    assert [e["kind"] for e in events(out)] == ["start", "end"]
    page = (out / "report.html").read_text()
    assert ">complete<" in page and "started plain.py a --b on 2 rank(s)" in page


def test_a_second_run_on_the_same_out_is_refused_in_one_line(tmp_path):
    script, go, out = tmp_path / "waits.py", tmp_path / "go", tmp_path / "out"
    script.write_text(WAITS)
    first = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "--nproc-per-node",
                              "1", "--out", str(out), str(script), str(go)], cwd=tmp_path,
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / ".phalanx.lock").is_file() or \
                not (out / ".phalanx.lock").read_text():  # the holder is written: held
            assert time.monotonic() < deadline and first.poll() is None, first.stderr
            time.sleep(0.1)
        second = phalanx_run(tmp_path, "--nproc-per-node", "1", "--out", str(out),
                             str(script), str(go))
        assert second.returncode == 2, second.stderr
        lines = second.stderr.splitlines()
        assert len(lines) == 1 and "is in use by another run (pid " in lines[0], lines
        assert lines[0].startswith("phalanx: error: `--out`") and not second.stdout
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 0, stderr
    again = phalanx_run(tmp_path, "--nproc-per-node", "1", "--out", str(out), str(script),
                        str(go))  # after it ended, the same --out runs again (a resume)
    assert again.returncode == 0, again.stderr
    assert [e["kind"] for e in events(out)] == ["start", "end", "start", "end"]


def test_an_exception_on_a_rank_is_shown_once_and_ends_the_job_fast(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    done = phalanx_run(tmp_path, "--nproc-per-node", "2", "--out", "out", script.name)
    elapsed = time.time() - float((tmp_path / "raised-at").read_text())  # start-up apart
    assert done.returncode == 1, done.stderr[-3000:]
    assert elapsed < 10, f"ended {elapsed:.1f} s after the raise"
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert done.stderr.count("ValueError: my script's own bug at step 3") == 2  # + the line
    assert 'raises.py", line 10' in done.stderr
    frames = [s for s in done.stderr.split("Traceback (most recent call last):\n")[1]
              .splitlines() if s.startswith("  File ")]  # the script's own only (40.14)
    assert len(frames) == 1 and 'raises.py", line 10' in frames[0], frames
    [line] = [s for s in done.stderr.splitlines() if s.startswith("phalanx: error:")]
    assert "rank 0 exited with code 1: ValueError" in line and "rank-0.log" in line, line
    assert "ValueError" in (tmp_path / "out/logs/rank-0.log").read_text()
    kinds = [e["kind"] for e in events(tmp_path / "out")]
    assert kinds == ["start", "failure"] and (tmp_path / "out/report.html").is_file()


def test_a_missing_script_or_a_syntax_error_is_one_line(tmp_path):
    (tmp_path / "bad.py").write_text("x = 1\ndef f(:\n")
    for script, needle in (("nope.py", "script `nope.py` does not exist"),
                           ("bad.py", "`bad.py` line 2: invalid syntax")):
        done = phalanx_run(tmp_path, "--nproc-per-node", "2", script)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("phalanx: error: ") and needle in line, line
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_under_torchrun_phalanx_run_is_one_rank(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2")
    done = phalanx_run(tmp_path, "--out", "out", script.name, launcher=torchrun)
    assert done.returncode == 0, done.stderr[-3000:]
    out = (tmp_path / "out").resolve()
    for rank in (0, 1):  # torchrun owns the output: both ranks print to it
        assert f"rank {rank}: [8.0, 8.0] in {out} with []" in done.stdout, done.stdout
    assert [e["kind"] for e in events(out)] == ["start", "end"]  # rank 0 kept the account
    assert (out / "report.html").is_file()


def test_a_killed_rank_restarts_and_resumes_bit_identically(tmp_path):
    script = tmp_path / "resumes.py"
    script.write_text(RESUMES)
    killed = phalanx_run(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1", "--out",
                         "killed", script.name, env={"TOTAL": "12", "KILL_AT": "5"})
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "phalanx: restart 1 of at most 1 after rank 1 was killed by SIGKILL" in killed.stderr
    assert "resumed from " in killed.stdout and "(step 4)" in killed.stdout, killed.stdout
    kinds = [(e["kind"], e["step"]) for e in events(tmp_path / "killed")]
    assert kinds == [("start", 0), ("restart", 4), ("end", 12)], kinds
    page = (tmp_path / "killed/report.html").read_text()  # 40.13: what phalanx.init knew
    assert "<b>ddp</b><span>strategy</span>" in page and "<b>2</b><span>ranks</span>" in page
    assert "<b>–</b><span>median step time</span>" not in page
    straight = phalanx_run(tmp_path, "--nproc-per-node", "2", "--out", "straight",
                           script.name, env={"TOTAL": "12"})
    assert straight.returncode == 0, straight.stderr[-3000:]
    a = torch.load(tmp_path / "killed/final.pt")
    b = torch.load(tmp_path / "straight/final.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ctrl_c_commits_at_the_next_save_and_says_how_to_resume(tmp_path):
    script = tmp_path / "resumes.py"
    script.write_text(RESUMES)
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2",
                             "--out", "out", script.name], cwd=tmp_path,
                            env={**ENV, "TOTAL": "100000"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # rank 0's progress: its saves install the stop handling
        if line.startswith("step 3"):
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert (stdout + stderr).count("is committed") == 1, stdout + stderr  # said once (40.14)
    [line] = [s for s in stderr.splitlines() if "stopped by" in s]
    assert line.startswith("phalanx: stopped by SIGINT: checkpoint step-"), line
    stop = int(line.split("checkpoint step-")[1].split()[0])
    command = "phalanx run --out out --nproc-per-node 2 resumes.py"
    assert line.endswith(f" is committed. Resume with: {command}"), line
    assert [(e["kind"], e["step"]) for e in events(tmp_path / "out")][-1] == ("stop", stop)
    resumed = phalanx_run(tmp_path, *shlex.split(command)[2:],
                          env={"TOTAL": str(stop + 2)})  # the command it said, as it is
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(step {stop})" in resumed.stdout and f"step {stop + 2}" in resumed.stdout


FORKS = """import os, subprocess, sys, threading, time
rank = os.environ["RANK"]
for name, own_session in (("child", False), ("daemon", True)):  # the 2nd: a session of its own
    child = subprocess.Popen(["sleep", "300"], start_new_session=own_session)
    with open(os.path.join(sys.argv[1], f"{name}-{rank}.pid"), "w") as fh:
        fh.write(str(child.pid))
threading.Thread(target=time.sleep, args=(3600,), name="forever").start()  # not a daemon
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_what_a_rank_forked_ends_with_the_job(tmp_path):
    """Issue 39: a process a rank started (in its session, or in one of its own) outlived
    the job; the launcher ends them when the job ends, and says so. A thread the script
    left running (not a daemon) hung the rank, and the job, forever: the rank ends anyway
    and says so in its log."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    done = phalanx_run(tmp_path, "--nproc-per-node", "2", "--out", "out", script.name,
                       str(tmp_path), timeout=60)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("*.pid"))]
    try:
        assert done.returncode == 0 and len(pids) == 4, done.stderr[-3000:]
        deadline = time.monotonic() + 5
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)], "processes the ranks started outlived the job"
        assert "ended 4 process(es) the ranks left running" in done.stderr, done.stderr
        log = (tmp_path / "out" / "logs" / "rank-1.log").read_text()
        assert "ending the process although thread(s) `forever` it started still run" in log
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# saves once (its saves become stop points), says "ready", waits for a file, then ends
# without another save — or saves again when given a second argument
WAITS_AFTER_SAVE = """import os, sys, time
import torch
import phalanx

run = phalanx.init(seed=0)
model, opt = run.setup(torch.nn.Linear(4, 1), lambda p: torch.optim.SGD(p, lr=0.05))
step = run.resume(run.out / "checkpoints", model, opt)
run.save(run.out / "checkpoints", step + 1, model, opt)
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def test_ctrl_c_is_acknowledged_at_once_and_a_run_that_finishes_is_finished(tmp_path):
    """Issue 40.3: Ctrl-C said nothing until the script's next run.save; a script that
    finished without one was reported "stopped by SIGINT" (exit 130, a stop event, a
    "Resume with" line). Now rank 0 says at once what will happen, the launcher forwards
    the signal and the job ends as the ranks end it."""
    script, go = tmp_path / "waits.py", tmp_path / "go"
    script.write_text(WAITS_AFTER_SAVE)
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2",
                             "--out", "out", script.name, str(go)], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("ready"):
                break
        proc.send_signal(signal.SIGINT)
        late = threading.Timer(20, go.touch)  # not said at once: the next line is what is
        late.start()  # said at the end (the assertion shows it)
        said = [proc.stderr.readline() for _ in range(2)]  # the launch line, then: at once
        late.cancel()
        assert said[1].startswith("phalanx: SIGINT: stopping at the script's next run.save"), said
    finally:
        go.touch()  # the script ends without another save
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "nothing was left to stop" in stderr and "Resume with" not in stderr, stderr
    assert "done; the run on one page" in stderr
    assert [e["kind"] for e in events(tmp_path / "out")] == ["start", "end"]
