"""Multi-node mistakes end in one line per launcher naming the cause (issue 25), not in
torch's `OSError` / `RendezvousTimeoutError` / `RendezvousConnectionError` tracebacks:
two launchers claiming node rank 0, swapped node ranks, a node that never arrives, two
launchers on one host, node 0's launcher dying while the others wait, and hosts started
with different flags. Two hosts as network namespaces (see test_multinode.py)."""

from __future__ import annotations

import signal
import time

import pytest
from test_multinode import WHY_NOT, finished, hosts, on_host  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "3", "--eval-every", "1000",
        "--sample-tokens", "0", "--nproc-per-node", "1"]


def _args(tmp_path, endpoint: str, nnodes: int = 2, timeout_s: int = 30, *extra: str):
    return [*TINY, "--nnodes", str(nnodes), "--rdzv-endpoint", endpoint, "--rdzv-timeout-s",
            str(timeout_s), "--out", str(tmp_path / "run"), *extra]


def _waiting(started, seconds: float = 90) -> None:
    """Until the launcher says it waits for the others (its store is up, if it hosts it)."""
    proc, _, err = started
    deadline = time.monotonic() + seconds
    while "waiting up to" not in err.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.2)


def _one_error(code: int, stderr: str, expected_code: int = 2) -> str:
    """The launcher's only error line (every other line is one of its `phalanx:` notes)."""
    assert code == expected_code, stderr[-3000:]
    assert "Traceback" not in stderr and "frame #" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert all(line.startswith("phalanx: ") for line in lines), lines
    errors = [line for line in lines if line.startswith("phalanx: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], lines
    return errors[0]


def test_two_launchers_claiming_node_rank_0_both_say_so(hosts, tmp_path):
    (a, _), (b, _) = hosts.items()
    args = _args(tmp_path, "10.77.0.1:29621", 2, 30, "--node-rank", "0")
    first = on_host(a, "node-a", args, tmp_path / "logs")
    _waiting(first)
    (code_a, _, err_a), (code_b, _, err_b) = finished(
        [first, on_host(b, "node-b", args, tmp_path / "logs")])
    line_b = _one_error(code_b, err_b)
    assert "`--node-rank 0` on node-b (10.77.0.2), but node rank 0 serves the rendezvous " \
           "and must run on the endpoint's host 10.77.0.1" in line_b, line_b
    assert "Start the host at 10.77.0.1 with `--node-rank 0` and this one with " \
           "`--node-rank 1`." in line_b, line_b
    line_a = _one_error(code_a, err_a)  # at once, not after the 30 s timeout
    assert "the rendezvous stopped on node-a: node-b (10.77.0.2) was started with " \
           "`--node-rank 0` too" in line_a and "`--node-rank 1`" in line_a, line_a


def test_swapped_node_ranks_both_say_so_at_once(hosts, tmp_path):
    (a, _), (b, _) = hosts.items()
    args = _args(tmp_path, "10.77.0.1:29622", 2, 60)
    began = time.monotonic()
    (code_a, _, err_a), (code_b, _, err_b) = finished(
        [on_host(a, "node-a", [*args, "--node-rank", "1"], tmp_path / "logs"),
         on_host(b, "node-b", [*args, "--node-rank", "0"], tmp_path / "logs")])
    # the rendezvous timeout (60 s) starts after start-up, so a run that waited for it
    # took longer than 60 s; start-up under load is the rest of the bound
    assert time.monotonic() - began < 58, "waited for the rendezvous timeout"
    line_a = _one_error(code_a, err_a)
    assert "`--node-rank 1` on node-a, but node-a holds the endpoint's address 10.77.0.1" \
           in line_a and "Start this host with `--node-rank 0`" in line_a, line_a
    line_b = _one_error(code_b, err_b)
    assert "`--node-rank 0` on node-b (10.77.0.2)" in line_b, line_b


def test_a_node_that_never_arrives_is_one_line_naming_endpoint_and_count(hosts, tmp_path):
    (a, _), _ = hosts.items()
    [(code, _, err)] = finished([on_host(
        a, "node-a", _args(tmp_path, "10.77.0.1:29623", 2, 3, "--node-rank", "0"),
        tmp_path / "logs")])
    line = _one_error(code, err)
    assert line.startswith("phalanx: error: the rendezvous at 10.77.0.1:29623 timed out on "
                           "node-a after 3 s: 1 of 2 node(s) arrived (from 10.77.0.1)."), line
    assert "`--nnodes 2 --rdzv-endpoint 10.77.0.1:29623" in line and "firewall" in line


def test_the_nodes_that_arrived_all_say_who_is_missing(hosts, tmp_path):
    """--nnodes 3 with two hosts: both stop with the count, the client too (not with a
    lost connection when the host of the store gives up first)."""
    (a, _), (b, _) = hosts.items()
    args = _args(tmp_path, "10.77.0.1:29624", 3, 12)  # node-b starts within it
    first = on_host(a, "node-a", args, tmp_path / "logs")
    _waiting(first)
    (code_a, _, err_a), (code_b, _, err_b) = finished(
        [first, on_host(b, "node-b", args, tmp_path / "logs")])
    for code, err in ((code_a, err_a), (code_b, err_b)):
        line = _one_error(code, err)
        assert "2 of 3 node(s) arrived (from 10.77.0.1, 10.77.0.2)" in line, line
    assert "timed out on node-a after 12 s" in err_a
    assert "the rendezvous stopped on node-b: the rendezvous host node-a timed out" in err_b


@pytest.mark.parametrize("rank,who", [
    ([], "holds the endpoint's address and has no `--node-rank`"),
    (["--node-rank", "0"], "is node rank 0")], ids=["no-node-rank", "both-node-rank-0"])
def test_two_launchers_on_one_host(hosts, tmp_path, rank, who):
    (a, _), _ = hosts.items()
    port = 29625 if rank else 29628
    args = _args(tmp_path, f"127.0.0.1:{port}", 2, 15, *rank)  # the second starts within it
    first = on_host(a, "node-a", args, tmp_path / "first")
    _waiting(first)
    [(code, _, err)] = finished([on_host(a, "node-a", args, tmp_path / "second")])
    line = _one_error(code, err)
    assert f"port {port} of 127.0.0.1 is already in use: this launcher on node-a {who}, so " \
           f"it serves the rendezvous there, but another launcher" in line, line
    assert "Give each host its own `--node-rank`" in line and "`--nproc-per-node`" in line
    [(code, _, err)] = finished([first])  # the first one waited for a second node alone
    assert "timed out on node-a after 15 s: 1 of 2" in _one_error(code, err)


def test_node_0_stopping_during_the_wait_is_one_line_on_the_others(hosts, tmp_path):
    (a, _), (b, _) = hosts.items()
    args = _args(tmp_path, "10.77.0.1:29626", 3, 60)
    first = on_host(a, "node-a", args, tmp_path / "logs")
    _waiting(first)
    second = on_host(b, "node-b", args, tmp_path / "logs")
    _waiting(second)
    time.sleep(2)  # node-b has joined
    first[0].send_signal(signal.SIGKILL)
    [(code, _, err)] = finished([second])
    line = _one_error(code, err, expected_code=1)
    assert "node-b lost the connection to the rendezvous store at 10.77.0.1:29626: the " \
           "launcher that serves it (node 0, on the endpoint's host) stopped" in line, line
    first[0].wait()


def test_hosts_started_with_a_different_lr_stop_in_one_line(hosts, tmp_path,
                                                            small_corpus_file, cache_dir):
    (a, _), (b, _) = hosts.items()
    args = _args(tmp_path, "10.77.0.1:29627", 2, 60, "--data", str(small_corpus_file),
                 "--cache-dir", str(cache_dir))
    results = finished([on_host(a, "node-a", [*args, "--lr", "2e-3"], tmp_path / "logs"),
                        on_host(b, "node-b", [*args, "--lr", "1e-3"], tmp_path / "logs")])
    for code, stdout, stderr in results:
        line = _one_error(code, stderr)
        assert "`--lr` is 0.002 on rank 0 (node-a), 0.001 on rank 1 (node-b)" in line, line
        assert not stdout.strip(), stdout
