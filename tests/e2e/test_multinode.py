"""Two machines made as Linux network namespaces (a veth pair, 10.x addresses, each with
its own host name via `unshare --uts`): one `phalanx train --nnodes 2` per namespace, met
through torch's elastic agent (c10d rendezvous) — the same command users run on two
hosts. Traffic stays inside the pair; the run directory is shared, as on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parents[1]))
import job_counts  # noqa: E402
from slurm_cluster import netns_missing  # noqa: E402

# one thread per rank on both sides: a machine of one rank would otherwise use both cores,
# and a matmul split over another number of threads may round differently (Muon's
# Newton–Schulz products, reductions over 4·C, do) — bitwise equality needs equal threads
ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "12", "--eval-every", "4",
        "--checkpoint-every", "4", "--sample-tokens", "0", "--threads-per-rank", "1"]


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    return netns_missing()


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


@pytest.fixture(scope="module")
def hosts():
    """Two namespaces joined by a veth pair: {name: address}."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"pxa{tag}", f"pxb{tag}"
    ip = lambda *args: subprocess.run(["ip", *args], check=True)  # noqa: E731
    ip("netns", "add", a)
    ip("netns", "add", b)
    try:
        ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        for ns, dev, addr in ((a, f"va{tag}", "10.77.0.1/24"), (b, f"vb{tag}", "10.77.0.2/24")):
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield {a: "10.77.0.1", b: "10.77.0.2"}
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def on_host(ns: str, hostname: str, args: list[str], logs: Path, env: dict | None = None,
            verb: str = "train"):
    """`phalanx VERB ARGS` in namespace `ns` as host `hostname`; (process, stdout path,
    stderr path) — files, not pipes: a full pipe would stall the node."""
    line = " ".join(["hostname", hostname, "&&", "exec", sys.executable, "-m", "phalanx",
                     verb, *args])
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"{hostname}.out", logs / f"{hostname}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                                 line], stdout=o, stderr=e, env={**os.environ, **(env or {})})
    return proc, out, err


def finished(started) -> list[tuple[int, str, str]]:
    return [(proc.wait(timeout=300), out.read_text(), err.read_text())
            for proc, out, err in started]


def two_nodes(hosts, out, port: int, extra: list[str], env: dict | None = None):
    (a, _), (b, _) = hosts.items()
    args = [*ARGS, *extra, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
            f"10.77.0.1:{port}", "--rdzv-timeout-s", "60", "--out", str(out)]
    logs = out.parent / f"{out.name}-logs"
    return finished([on_host(a, "node-a", args, logs, env), on_host(b, "node-b", args, logs,
                                                                    env)])


def local(tmp_path, data: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, *data,
                           "--nproc-per-node", "2", "--out", str(tmp_path / "local")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return load_file(str(tmp_path / "local" / "model.safetensors"))


def same(out, reference: dict) -> bool:
    got = load_file(str(out / "model.safetensors"))
    return got.keys() == reference.keys() and all(torch.equal(got[k], reference[k])
                                                  for k in reference)


def test_two_machines_train_like_two_local_ranks(hosts, tmp_path, small_corpus_file,
                                                 cache_dir):
    data = ["--data", str(small_corpus_file), "--cache-dir", str(cache_dir)]
    counting = job_counts.env(tmp_path)
    results = two_nodes(hosts, tmp_path / "two", 29611, data, env=counting)
    for code, stdout, stderr in results:
        assert code == 0, stdout[-1500:] + stderr[-1500:]
    per_pid = job_counts.read(counting)  # each machine's launcher parses; its worker starts
    parsers = job_counts.parsers(per_pid)  # from the job it was handed (issue 42)
    assert len(parsers) == 2 and all(per_pid[p]["parse"] == 1 for p in parsers), per_pid
    assert len(per_pid) == 4, per_pid  # + 2 workers, each deciding its strategy once
    assert all(c["choose"] == 1 for p, c in per_pid.items() if p not in parsers), per_pid
    assert not list((tmp_path / "two").glob("job-launcher-*")), "a launcher's job was left"
    (_, out_a, err_a), (_, out_b, err_b) = results
    assert "(node-a, 10.77.0.1 on va" in err_a and "(hosted here)" in err_a
    assert "(node-b, 10.77.0.2 on vb" in err_b and "(hosted here)" not in err_b
    assert (out_a + out_b).count("done: 12 steps") == 1  # one job, one rank 0
    assert same(tmp_path / "two", local(tmp_path, data))


def test_a_killed_rank_on_one_machine_recovers_from_the_checkpoint(hosts, tmp_path,
                                                                   small_corpus_file,
                                                                   cache_dir):
    data = ["--data", str(small_corpus_file), "--cache-dir", str(cache_dir)]
    results = two_nodes(hosts, tmp_path / "killed", 29612, [*data, "--max-restarts", "1"],
                        env={"PHALANX_FAULT": "rank=1,step=6,phase=step,action=kill"})
    for code, stdout, stderr in results:
        assert code == 0, stdout[-1500:] + stderr[-1500:]
    said = "".join(r[1] for r in results)
    assert "restart 1 of at most 1" in said and "resumed from" in said and "step-00000004" in said
    assert same(tmp_path / "killed", local(tmp_path, data))


def test_an_unreachable_endpoint_is_one_line_after_the_timeout(hosts, tmp_path):
    (_, _), (b, _) = hosts.items()
    [(code, _, stderr)] = finished([on_host(
        b, "node-b", ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                      "10.77.0.1:29613", "--rdzv-timeout-s", "3", "--out",
                      str(tmp_path / "alone")], tmp_path / "logs")])
    assert code == 2, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "phalanx: error: cannot reach the rendezvous at 10.77.0.1:29613 within 3 s")
    assert "Traceback" not in stderr and "frame #" not in stderr, stderr


def test_a_lost_machine_is_named_by_host_and_rank(hosts, tmp_path, small_corpus_file,
                                                  cache_dir):
    """Without restarts, node-b's rank is killed: node-b's launcher says the job failed
    there and how; node-a's says its rank lost the connection to rank 1 on node-b."""
    data = ["--data", str(small_corpus_file), "--cache-dir", str(cache_dir)]
    (code_a, _, err_a), (code_b, _, err_b) = two_nodes(
        hosts, tmp_path / "lost", 29614, data,
        env={"PHALANX_FAULT": "rank=1,step=6,phase=step,action=kill"})
    assert code_a == code_b == 1, err_a[-1500:] + err_b[-1500:]
    last_b = err_b.strip().splitlines()[-1]
    assert "the job failed on node-b: rank 1 exited with code -9" in last_b, err_b[-1500:]
    last_a = err_a.strip().splitlines()[-1]
    assert "the job failed on node-a" in last_a and \
        "lost the connection to rank 1 on node-b (10.77.0.2)" in last_a, err_a[-1500:]


def doctor_on_two(hosts, tmp_path, port: int, env_a: dict | None = None):
    (a, _), (b, _) = hosts.items()
    args = ["--json", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
            f"10.77.0.1:{port}", "--rdzv-timeout-s", "60", "--init-timeout-s", "30"]
    logs = tmp_path / "logs"
    return finished([on_host(a, "node-a", args, logs, env_a, verb="doctor"),
                     on_host(b, "node-b", args, logs, verb="doctor")])


def test_doctor_across_two_machines_checks_they_reach_each_other(hosts, tmp_path):
    (code_a, out_a, err_a), (code_b, _, err_b) = doctor_on_two(hosts, tmp_path, 29615)
    report = json.loads(out_a)  # stdout is the JSON alone
    # both machines exit with rank 0's verdict (the timing checks may fail on 2 shared cores)
    assert code_a == code_b == (1 if report["failed"] else 0), err_a[-1500:] + err_b[-1500:]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["process group init"]["status"] == "pass"
    assert checks["machines reach each other"]["status"] == "pass"
    assert "2 machine(s)" in checks["machines reach each other"]["evidence"]


def test_doctor_names_the_machine_that_cannot_be_reached(hosts, tmp_path):
    """node-a's collectives listen on an interface node-b has no route to (a wrong
    GLOO_SOCKET_IFNAME): the rendezvous works, the process group would hang; doctor says
    who cannot reach whom, on both machines, without making the group."""
    (a, _), _ = hosts.items()
    dummy = f"pxd{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "-n", a, "link", "add", dummy, "type", "veth", "peer", "name",
                    f"{dummy}p"], check=True)  # an interface on a network node-b lacks
    try:
        subprocess.run(["ip", "-n", a, "addr", "add", "10.88.0.1/24", "dev", dummy], check=True)
        for dev in (dummy, f"{dummy}p"):
            subprocess.run(["ip", "-n", a, "link", "set", dev, "up"], check=True)
        (code_a, out_a, err_a), (code_b, _, err_b) = doctor_on_two(
            hosts, tmp_path, 29616, env_a={"GLOO_SOCKET_IFNAME": dummy})
    finally:
        subprocess.run(["ip", "-n", a, "link", "del", dummy], capture_output=True)
    assert (code_a, code_b) == (1, 1), err_a[-1500:] + err_b[-1500:]
    [check] = json.loads(out_a)["checks"]
    assert check["status"] == "fail", check
    assert check["evidence"].startswith(
        f"node-b cannot reach node-a at 10.88.0.1:") and \
        f"(GLOO_SOCKET_IFNAME={dummy} there)" in check["evidence"], check
