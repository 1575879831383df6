"""`--fault-tolerance torchft` (issue 31): 2 replica groups of 1 rank on gloo.

- Without failures the run is the same run as `--strategy ddp` on 2 ranks: weights
  bit-identical.
- Group 1's rank SIGKILLed three times (each after it trained a few steps since it
  rejoined, torchft's punisher style): the run finishes; both groups' weights agree after
  every step both took (their fingerprints in ft-steps.jsonl); each rejoin is a heal;
  each membership change is one console line; the final weights equal a reference
  replayed in one process from the membership the run recorded (tests/ft_replay.py); and,
  apart from the code that replay shares with the run, from the sample indices of each
  step attempt: the committed steps read each sample of the global order once, in order,
  and the kills (each sent while group 1 is inside an all-reduce group 0 has not joined)
  failed steps that were taken again on the same samples (`ft_replay.each_sample_once`).
The time each failure costs beside restart-from-checkpoint: benchmarks/ft_vs_restart.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import job_counts
import procs
from runs import same_model

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'phalanx[ft]')")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ft_vs_restart  # noqa: E402
from ft_vs_restart import command, punish  # noqa: E402

from ft_replay import each_sample_once, recorded, replay  # noqa: E402
from phalanx.cluster.protocol import FT_SAMPLES as SAMPLES  # noqa: E402

# the chaos run: 3 kills over 350 steps in CI, over 500 on demand (PHALANX_FULL=1)
KILLS, STEPS = 3, (500 if os.environ.get("PHALANX_FULL") == "1" else 350)

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "10", "--eval-batches", "2",
        "--log-every", "5", "--sample-tokens", "0", "--checkpoint-every", "10",
        "--max-steps", "20", "--hang-timeout-s", "0", "--nproc-per-node", "2",
        "--threads-per-rank", "1", "--tokenizer", "bytes"]


def _train(out: Path, corpus: Path, cache: Path, *extra: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "train", *TINY, "--data",
                           str(corpus), "--cache-dir", str(cache), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def _steps(replica: Path) -> dict[int, dict]:
    lines = (replica / "ft-steps.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


def _val(run_dir: Path) -> dict[int, float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}


def _events(replica: Path, kind: str) -> list[dict]:
    lines = (replica / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def test_without_failures_it_is_the_ddp_run_bit_for_bit(tmp_path, small_corpus_file,
                                                         cache_dir):
    counted = job_counts.env(tmp_path)
    ft = _train(tmp_path / "ft", small_corpus_file, cache_dir, "--fault-tolerance", "torchft",
                "--sample-tokens", "8", env=counted)
    assert ft.returncode == 0, ft.stdout + ft.stderr
    # one job, decided once (issue 42): the command line parsed by the launcher only (each
    # group's launcher and its rank start from the job they are handed; before: all 5
    # parsed), the strategy decided once in each of the 5 processes (before: twice)
    per_pid = job_counts.read(counted)
    assert len(job_counts.parsers(per_pid)) == 1 and len(per_pid) == 5, per_pid
    assert all(c["parse"] <= 1 and c["choose"] == 1 for c in per_pid.values()), per_pid
    said = [(line[:4], line[4:8]) for line in ft.stdout.splitlines()
            if line[4:].startswith(("done: ", "--- sample ---"))]
    assert said == [("g0| ", "--- "), ("g0| ", "done")], said  # one group says them (40.14)
    ddp = _train(tmp_path / "ddp", small_corpus_file, cache_dir)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    out = tmp_path / "ft"
    assert same_model(out / "replica-0", tmp_path / "ddp")
    assert same_model(out / "replica-1", tmp_path / "ddp")
    # each group evaluates every share of the 2-rank ddp run: the same val loss, not that
    # of its own 1-rank share (before: 5.4710 against 5.4696 at step 10)
    assert _val(out / "replica-0") == _val(out / "replica-1") == _val(tmp_path / "ddp") != {}
    # the job's result where any run leaves it (issue 45), the groups' details below it
    assert same_model(out, tmp_path / "ddp") and (out / "report.html").is_file()
    assert (out / "sample.txt").read_text() == (out / "replica-0" / "sample.txt").read_text()
    assert not (out / "ft-steps.jsonl").exists()
    assert "phalanx: the run's result is in " in ft.stdout
    assert {r["participants"] for r in _steps(out / "replica-0").values()} == {2}
    said = [line for line in ft.stdout.splitlines() if " live (global batch " in line]
    assert said == ["g0| phalanx: step 1: 2 replica groups live (global batch 4 sequences)"]
    assert "Traceback" not in ft.stdout + ft.stderr
    again = _train(out, small_corpus_file, cache_dir, "--fault-tolerance", "torchft")
    assert again.returncode == 0 and "the run is complete" in again.stdout, again.stdout
    # a higher --max-steps trains further, as it does without torchft: the same bits
    more = _train(out, small_corpus_file, cache_dir, "--fault-tolerance", "torchft",
                  "--max-steps", "26")
    assert more.returncode == 0 and "the run is complete" not in more.stdout, more.stdout
    ddp_more = _train(tmp_path / "ddp", small_corpus_file, cache_dir, "--max-steps", "26")
    assert ddp_more.returncode == 0, ddp_more.stdout + ddp_more.stderr
    assert max(_steps(out / "replica-0")) == 26
    assert same_model(out / "replica-0", tmp_path / "ddp") and same_model(out / "replica-1", out / "replica-0")
    assert same_model(out, tmp_path / "ddp")  # the result at the top is the extended run's


def test_fp16_without_failures_is_the_fp16_ddp_run_bit_for_bit(tmp_path, small_corpus_file,
                                                                cache_dir):
    """fp16 under torchft: every group scales its loss alike (the all-reduce averages
    scaled gradients; the heal carries the scale: tests/unit/test_ft.py), so the result is
    the ddp run's."""
    fp16 = ("--precision", "fp16")
    ft = _train(tmp_path / "ft", small_corpus_file, cache_dir, *fp16,
                "--fault-tolerance", "torchft")
    assert ft.returncode == 0, ft.stdout + ft.stderr
    ddp = _train(tmp_path / "ddp", small_corpus_file, cache_dir, *fp16)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert same_model(tmp_path / "ft", tmp_path / "ddp")
    assert same_model(tmp_path / "ft" / "replica-1", tmp_path / "ddp")


def test_a_rollback_is_taken_by_every_group_alike_and_ends_as_the_ddp_run(
        tmp_path, small_corpus_file, cache_dir):
    """`--on-nan rollback`: a NaN loss at step 16 (the fault's rank 0 is each group's rank,
    as it is ddp's rank 0; the averaged loss is NaN in every group either way); every group
    reloads the checkpoint of step 10 and goes on past the bad batch, as the ddp run does:
    the same bits, each group's ft-steps.jsonl holds every step once, and torchft's step
    counter is the trainer's at every step."""
    nan = {**os.environ, "PHALANX_FAULT": "rank=0,step=15,phase=step,action=nan"}
    rollback = ("--on-nan", "rollback")
    ft = _train(tmp_path / "ft", small_corpus_file, cache_dir, *rollback,
                "--fault-tolerance", "torchft", env=nan)
    assert ft.returncode == 0, ft.stdout + ft.stderr
    ddp = _train(tmp_path / "ddp", small_corpus_file, cache_dir, *rollback, env=nan)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    said = [line for line in ft.stdout.splitlines() if "rolled back to the checkpoint" in line]
    assert len(said) == 2 and {line[:4] for line in said} == {"g0| ", "g1| "}, ft.stdout
    assert all("rolled back to the checkpoint of step 10" in line for line in said), said
    assert same_model(tmp_path / "ft", tmp_path / "ddp")
    assert same_model(tmp_path / "ft" / "replica-1", tmp_path / "ddp")
    for g in (0, 1):
        lines = (tmp_path / "ft" / f"replica-{g}" / "ft-steps.jsonl").read_text().splitlines()
        records = [json.loads(x) for x in lines]
        assert [r["step"] for r in records] == list(range(1, 21)), lines
        assert all(r["torchft_step"] == r["step"] for r in records), lines


def _group_rank(group: int) -> int | None:
    """The pid of replica group `group`'s rank (as ft_vs_restart.victim finds group 1's)."""
    for entry in Path("/proc").iterdir():
        try:
            env = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if f"PHALANX_FT_GROUP={group}".encode() in env and b"PHALANX_LAUNCHED=1" in env \
                and any(v.startswith(b"LOCAL_RANK=") for v in env):
            return int(entry.name)
    return None


def _last_attempt(replica: Path) -> int | None:
    """The step of the group's attempt in flight (its samples written, no verdict yet)."""
    try:
        with open(replica / "ft-samples.jsonl", "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            last = json.loads(fh.read().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        return None
    return last["step"] if "samples" in last else None


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
    except OSError:
        return True


def in_the_all_reduce(out: Path):
    """ft_vs_restart.victim for a kill that fails a step: group 1's rank once it has
    started an all-reduce (its attempt's samples written, no verdict) that group 0 has
    not joined — group 0 is stopped (SIGSTOP) before it does and continued just after the
    kill, so its all-reduce fails and torchft takes the step again. Else, after 2 s, as
    ft_vs_restart kills it."""
    find = ft_vs_restart.victim

    def victim(mode: str) -> int | None:
        pid, other = find(mode), _group_rank(0)
        deadline = time.monotonic() + 2
        while pid is not None and other is not None and time.monotonic() < deadline:
            step = _last_attempt(out / "replica-1")
            if step is not None and _last_attempt(out / "replica-0") != step:
                os.kill(other, signal.SIGSTOP)
                while not _stopped(other):
                    time.sleep(0.0005)
                if _last_attempt(out / "replica-0") != step and \
                        _last_attempt(out / "replica-1") == step:
                    threading.Timer(0.05, os.kill, (other, signal.SIGCONT)).start()
                    return pid  # killed at once by punish
                os.kill(other, signal.SIGCONT)
            time.sleep(0.001)
        return pid
    return victim


@pytest.mark.solo  # under xdist, a killed group's restart was once too slow to rejoin
def test_a_group_killed_again_and_again_rejoins_bit_exact(tmp_path, corpus_file, cache_dir,
                                                          monkeypatch):
    out = tmp_path / "chaos"
    monkeypatch.setenv(SAMPLES, "1")  # each step attempt's samples: ft-samples.jsonl
    monkeypatch.setattr(ft_vs_restart, "victim", in_the_all_reduce(out))
    cmd = command("torchft", out, corpus_file, cache_dir, steps=STEPS, every=50)
    run = punish("torchft", cmd, kills=KILLS, life=25, say=lambda line: None)
    console = "\n".join(run.console)
    assert run.code == 0, console[-3000:]
    assert run.kills == KILLS and "Traceback" not in console, console[-3000:]
    g0, g1 = _steps(out / "replica-0"), _steps(out / "replica-1")
    assert sorted(g0) == list(range(1, STEPS + 1))  # group 0 took every step
    both = sorted(set(g0) & set(g1))
    assert [s for s in both if g0[s]["fingerprint"] != g1[s]["fingerprint"]] == []
    assert any(r["participants"] == 1 for r in g0.values())  # it went on alone meanwhile
    heals = _events(out / "replica-1", "heal")
    assert len(heals) == KILLS, heals
    for heal in heals:  # the step after each heal: already identical to the live group
        assert g1[heal["step"]]["healed"] and \
            g1[heal["step"]]["fingerprint"] == g0[heal["step"]]["fingerprint"]
    changes = [line for line in run.console if " live (global batch " in line]
    assert all(line.startswith("g0| phalanx: step ") for line in changes), changes
    rejoined = [line for line in run.console if "group 1 rejoined" in line]
    assert len(rejoined) == KILLS and all(x.startswith("g1| phalanx: step ") for x in rejoined)
    members = recorded(out / "replica-0")
    expected = 1 + sum(members[s] != members[s - 1] for s in range(2, STEPS + 1))
    assert len(changes) == expected, changes  # one line per change, and only then
    assert same_model(out / "replica-0", out / "replica-1")
    reference = replay(out / "replica-0")
    final = load_file(out / "replica-0" / "model.safetensors")
    assert all(torch.equal(final[k], reference[k]) for k in final), "not the recorded run"
    # and the data, apart from the code the replay shares with the run: the committed steps
    # read the global order's prefix, each sample once; a step that failed was retried
    steps, failed = each_sample_once([out / "replica-0", out / "replica-1"])
    assert steps == STEPS and failed >= 1, (steps, failed)


def test_a_stopped_torchft_run_resumes_to_the_same_bits(tmp_path, small_corpus_file,
                                                         cache_dir):
    """Ctrl-C while the groups step (milliseconds a step: the signal reaches them at
    different steps): they agree to stop after the same step, each commits a checkpoint
    there, the launcher says how it ended in one line, naming the checkpoint the groups
    committed (the groups' lines name no internal command); the same command resumes both
    groups, they meet before their first quorum, and the run ends as the ddp run does.

    Meanwhile every socket the job listens on — the launcher's lighthouse and start store,
    each group's torchft manager server and checkpoint server, the groups' own stores —
    is on loopback (issue 39: torchft's two servers and the start store listened on every
    interface). And the membership record holds each step once after a resume from a
    checkpoint older than its last line (what a crash after the checkpoint leaves:
    planted here), as metrics.jsonl does."""
    import os
    import signal
    import threading

    out = tmp_path / "ft"
    cmd = [sys.executable, "-m", "phalanx", "train", *TINY, "--log-every", "1", "--data",
           str(small_corpus_file), "--cache-dir", str(cache_dir), "--out", str(out),
           "--fault-tolerance", "torchft", "--max-steps", "400", "--checkpoint-every", "1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    listeners: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("g0| step 30/") and not any("SENT" in x for x in lines):
                listeners.extend(procs.listening({proc.pid} | procs.descendants(proc.pid)))
                lines.append("SENT\n")
                os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.wait(timeout=300)
    reader.join(timeout=10)
    console = "".join(lines)
    assert proc.returncode == 130, console
    said = [x for x in lines if x.startswith(("phalanx: stopped", "g0| phalanx: stopped",
                                              "g1| phalanx: stopped"))]
    # 2 groups x (manager server, checkpoint server, 2 stores of their agent) + the
    # launcher's lighthouse and start store
    assert len(listeners) >= 10, listeners
    assert [x for x in listeners if not procs.on_loopback(x)] == [], listeners
    kept = {g: sorted(p.name for p in (out / f"replica-{g}" / "checkpoints").glob("step-*"))
            for g in (0, 1)}
    assert kept[0] == kept[1] and len(kept[0]) == 1, kept  # the same step in both
    assert said[-1] == f"phalanx: stopped by SIGINT: checkpoint {kept[0][0]} is committed " \
        "in every replica group; run the same command to resume.\n", said
    assert not any("Resume with" in x for x in said) and "Traceback" not in console
    stop = int(kept[0][0].split("-")[1])
    for g in (0, 1):  # a continuation past the checkpoint that was lost
        record = json.dumps({**_steps(out / f"replica-{g}")[stop], "fingerprint": "lost"})
        with open(out / f"replica-{g}" / "ft-steps.jsonl", "a") as fh:
            fh.writelines(record.replace(f'"step": {stop}', f'"step": {stop + k}') + "\n"
                          for k in (1, 2, 3))
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "1 replica group live" not in resumed.stdout  # they met before their first quorum
    for g in (0, 1):
        lines = (out / f"replica-{g}" / "ft-steps.jsonl").read_text().splitlines()
        steps = [json.loads(x)["step"] for x in lines]
        assert steps == list(range(1, 401)) and "lost" not in "".join(lines), steps[stop - 2:]
    ddp = _train(tmp_path / "ddp", small_corpus_file, cache_dir, "--max-steps", "400")
    assert ddp.returncode == 0, ddp.stderr
    assert same_model(out / "replica-0", tmp_path / "ddp")
    assert same_model(out / "replica-1", tmp_path / "ddp")


def test_a_refused_combination_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "phalanx", "train", "--fault-tolerance",
                           "torchft", "--strategy", "fsdp", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "phalanx: error: `--fault-tolerance torchft` runs one rank per replica group with "
        "replicated weights; `--strategy fsdp` shards them (HSDP inside a group is not built "
        "yet). Use `--strategy ddp`."]
    assert not out.exists()


def test_out_is_one_locked_run_directory_without_links(tmp_path, outside, small_corpus_file,
                                                       cache_dir):
    """Issue 39: a planted `OUT/replica-0` link had a whole group's run written into its
    target, and a torchft launch neither checked nor locked OUT; a run without torchft
    in OUT was left beside a new torchft run (two lineages). Each is refused in one line
    before anything is written or moved."""
    from test_run_dir_links import refused_naming

    from links import SECRET
    from phalanx.checkpoint.rundir import RunDirLock

    out = tmp_path / "run"
    out.mkdir()
    (out / "replica-0").symlink_to(outside / "dir", target_is_directory=True)
    linked = _train(out, small_corpus_file, cache_dir, "--fault-tolerance", "torchft")
    assert not any((outside / "dir").iterdir()) and (outside / "file").read_text() == SECRET
    assert sorted(p.name for p in out.iterdir()) == ["replica-0"]
    refused_naming(linked, out / "replica-0", outside / "dir")
    (out / "replica-0").unlink()
    with RunDirLock(out):  # another run holds OUT
        held = _train(out, small_corpus_file, cache_dir, "--fault-tolerance", "torchft")
    assert held.returncode == 2 and "is in use by another run" in held.stderr, held.stderr
    assert not list(out.glob("replica-*")), list(out.iterdir())
    (out / "checkpoints" / "step-00000010").mkdir(parents=True)  # a run without torchft
    (out / "metrics.jsonl").write_text('{"step": 10}\n')
    other = _train(out, small_corpus_file, cache_dir, "--fault-tolerance", "torchft")
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stdout + other.stderr
    assert "holds a run without `--fault-tolerance` (`checkpoints`, `metrics.jsonl`)" in \
        other.stderr and "`--resume never`" in other.stderr, other.stderr
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "metrics.jsonl"]
