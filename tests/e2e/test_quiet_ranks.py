"""Quiet ranks: every rank writes to OUT/logs/rank-R.log; the console shows rank 0's
progress and, when the job fails, one line that names the log holding the traceback.
`--tee-ranks` puts every rank back on the console. The same for `phalanx watch`."""

from __future__ import annotations

import re
import subprocess
import sys

from test_fault_tolerance import train

ONE_PERIOD = re.compile(r"[^.]\.$")  # a message ends with exactly one period


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("phalanx: error:")]


def test_a_diverged_replica_is_one_line_and_its_traceback_is_in_the_log(
        tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path, small_corpus_file, cache_dir, "rank=1,step=2,action=perturb",
                 "--check-consistency-every", "2")
    assert proc.returncode == 1
    console = proc.stdout + proc.stderr
    assert "Traceback" not in console and "[rank0]" not in console, console
    assert "step 1/12" in proc.stdout  # rank 0's progress is still shown
    [line] = error_lines(proc.stderr)
    assert "`wte.weight` differs on rank(s) 1" in line, line
    assert ONE_PERIOD.search(line), line
    logs = tmp_path / "logs"
    assert f"Full output: {logs / 'rank-0.log'}, {logs / 'rank-1.log'}." in line
    for rank in (0, 1):
        text = (logs / f"rank-{rank}.log").read_text()
        assert text.startswith(f"=== rank {rank} on "), text[:200]
        assert "Traceback (most recent call last)" in text and "check_same" in text


def test_an_unexplained_error_shows_its_traceback_once(tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path, small_corpus_file, cache_dir, "rank=1,step=2,action=raise")
    assert proc.returncode == 1
    assert proc.stderr.count("Traceback (most recent call last)") == 1, proc.stderr
    assert "[rank 1] Traceback" in proc.stderr and "InjectedFault" in proc.stderr
    [line] = error_lines(proc.stderr)
    assert ONE_PERIOD.search(line) and "rank-1.log" in line, line
    assert "InjectedFault: injected fault at step 2" in \
        (tmp_path / "logs" / "rank-1.log").read_text()


def test_tee_ranks_shows_every_rank(tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path, small_corpus_file, cache_dir, "rank=1,step=2,action=raise",
                 "--tee-ranks")
    assert proc.returncode == 1
    assert proc.stderr.count("InjectedFault: injected fault at step 2") >= 2  # rank's + line
    assert not (tmp_path / "logs").exists()


SCRIPT = """import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"hello from rank {rank}", flush=True)
print(f"stderr of rank {rank}", file=sys.stderr, flush=True)
t = torch.ones(1)
dist.all_reduce(t)
if rank == 1:
    raise ValueError("my script's own bug on rank 1")
dist.all_reduce(t)
dist.destroy_process_group()
"""


def test_watch_keeps_rank_0_on_the_console_and_the_rest_in_logs(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "watch", "--nproc-per-node", "2", "--report-dir",
         str(tmp_path), str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 1
    assert "hello from rank 0" in proc.stdout and "stderr of rank 0" in proc.stderr
    assert "rank 1" not in proc.stdout and "stderr of rank 1" not in proc.stderr
    assert proc.stderr.count("Traceback (most recent call last)") == 1, proc.stderr
    assert "ValueError: my script's own bug on rank 1" in proc.stderr
    [line] = error_lines(proc.stderr)
    assert "Full output: logs/rank-" in line and ONE_PERIOD.search(line), line
    one = (tmp_path / "logs" / "rank-1.log").read_text()
    assert "hello from rank 1" in one and "stderr of rank 1" in one and "ValueError" in one
