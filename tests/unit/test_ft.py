"""phalanx.ft's pieces that need no process: the data a replica group reads per step, the
refusals of `--fault-tolerance torchft`, and how the group launcher ends."""

from __future__ import annotations

import signal
import sys

import pytest
import torch
from torch.utils.data import TensorDataset

from phalanx.config.sections import build_config
from phalanx.data.sampler import ShardedBatchSampler
from phalanx.errors import Interrupted, UserError
from phalanx.ft.gate import QuorumBatches
from phalanx.ft.groups import HTTP_LOG, _outcome, check, without_access_logs


def test_a_group_reads_what_the_same_rank_of_ddp_reads():
    data = TensorDataset(torch.arange(100), torch.arange(100) * 10)
    batches = QuorumBatches(data, 3, seed=7, device=torch.device("cpu"))
    for world in (1, 2, 3):
        for rank in range(world):
            ddp = iter(ShardedBatchSampler(100, 3, rank, world, seed=7, stream=True,
                                           position=12))
            batches.aim(12, rank, world)
            for _ in range(4):  # four micro-batches (accumulation), across the epoch's end
                x, y = next(batches)
                assert x.tolist() == next(ddp) and torch.equal(y, x * 10)


def test_a_group_collates_a_users_items_as_the_loader_does():
    from phalanx.data.loader import DeviceLoader

    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"ids": torch.full((2,), i), "label": i}

    sampler = ShardedBatchSampler(20, 4, 1, 2, seed=3, stream=True)
    loader = next(iter(DeviceLoader(Dicts(), sampler, torch.device("cpu"))))
    batches = QuorumBatches(Dicts(), 4, seed=3, device=torch.device("cpu"))
    batches.aim(0, 1, 2)
    mine = next(batches)
    assert mine.keys() == loader.keys() and all(torch.equal(mine[k], loader[k]) for k in mine)


def _cfg(**dist):
    return build_config({"dist": {"fault_tolerance": "torchft", **dist}})


@pytest.mark.parametrize("dist, train, says", [
    ({"strategy": "fsdp"}, {}, "HSDP inside a group is not built yet"),
    ({"nnodes": "2", "rdzv_endpoint": "127.0.0.1:29400"}, {}, "--lighthouse HOST:PORT"),
    ({"min_replicas": 3}, {}, r"`--min-replicas 3` is more than the 2 replica groups"),
])
def test_what_torchft_cannot_do_yet_is_refused_plainly(dist, train, says):
    pytest.importorskip("torchft", reason="torchft is not installed")
    cfg = build_config({"dist": {"fault_tolerance": "torchft", **dist}, "train": train})
    with pytest.raises(UserError, match=says):
        check(cfg)


def test_without_torchft_installed_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # import torchft raises ImportError
    with pytest.raises(UserError, match=r"pip install 'phalanx\[ft\]'"):
        check(_cfg())


def test_a_bad_lighthouse_address_names_its_flag():
    with pytest.raises(UserError, match="`--lighthouse nowhere` must be HOST:PORT"):
        _cfg(lighthouse="nowhere")


@pytest.mark.parametrize("given, url", [
    ("10.0.0.1:29510", "http://10.0.0.1:29510"), ("lh.example:29510", "http://lh.example:29510"),
    ("http://lh:29510", "http://lh:29510"), ("http://lh:29510/", "http://lh:29510"),
    ("[fd00::1]:29510", "http://[fd00::1]:29510")])
def test_a_lighthouse_is_host_port_or_its_url(given, url):
    """What the docs say (`--lighthouse HOST:PORT`) is what torchft is given as a URL: a
    bare HOST:PORT made every group wait 60 s for 'scheme is missing' (issue 39)."""
    from phalanx.config.dist import lighthouse_url

    assert lighthouse_url(_cfg(lighthouse=given).dist.lighthouse) == url


@pytest.mark.parametrize("bad", ["ftp://lh:29510", "https://lh:29510", "http://lh",
                                 "http://lh:29510/x", "lh:29510/x", "a/b:29510", "u@lh:29510",
                                 "http://:29510"])
def test_any_other_lighthouse_is_refused_before_launch(bad):
    with pytest.raises(UserError, match=r"must be HOST:PORT or http://HOST:PORT"):
        _cfg(lighthouse=bad)


def test_the_run_ends_with_the_group_that_finished_it(capsys, tmp_path):
    names, folders = ["0", "1"], [tmp_path / "replica-0", tmp_path / "replica-1"]
    assert _outcome([0, -15], [], names, folders) == (0, "0")
    assert "replica group 0 finished the run (stopped behind it: group 1)" in \
        capsys.readouterr().out
    assert _outcome([-15, 0], [], names, folders) == (0, "1")
    assert _outcome([2, 2], [], names, folders) == (2, None)  # a user error in every group
    assert _outcome([1, -9], [], names, folders) == (1, None)


def _committed(folder, name):
    (folder / "checkpoints" / name).mkdir(parents=True)
    (folder / "checkpoints" / "latest").write_text(name)


def test_a_stop_says_what_the_groups_committed(tmp_path):
    """Issue 39: stopped before any step, the launcher said 'each replica group committed a
    checkpoint' while each group said none was."""
    names, folders = ["0", "1"], [tmp_path / "replica-0", tmp_path / "replica-1"]
    with pytest.raises(Interrupted) as none:
        _outcome([130, 130], [signal.SIGINT], names, folders)
    assert str(none.value) == "stopped by SIGINT: no replica group had committed a " \
        "checkpoint yet; the same command starts the run again."
    for folder in folders:
        _committed(folder, "step-00000030")
    with pytest.raises(Interrupted, match="checkpoint step-00000030 is committed in every "
                                          "replica group; run the same command to resume"):
        _outcome([130, 130], [signal.SIGINT], names, folders)
    with pytest.raises(Interrupted, match=r"replica group 0 exited with code 130 \(checkpoint "
                       r"step-00000030 is committed\), replica group 1 exited with code 1 "):
        _outcome([130, 1], [signal.SIGINT], names, folders)


def test_torchfts_request_log_is_told_from_a_training_line():
    assert HTTP_LOG.search('::ffff:127.0.0.1 - - [25/Nov/2026 10:03:06] '
                           '"GET /checkpoint/60/full HTTP/1.1" 200 -')
    assert not HTTP_LOG.search("step 60/300 | loss 1.0 | GET /checkpoint/")


def test_an_access_log_entry_inside_a_line_is_cut_out_and_the_line_rejoined():
    """What CI saw: the server's entry written between a message and its newline (print
    writes them apart when unbuffered) hid the membership line from the console."""
    entry = '::ffff:127.0.0.1 - - [25/Nov/2026 10:03:06] "GET /checkpoint/111/full HTTP/1.1" 200 -\n'
    message = "phalanx: step 112: 2 replica groups live (global batch 16 sequences)"
    assert list(without_access_logs([message + entry, "\n", "step 112/500 | loss 1.0\n"])) == \
        [message + "\n", "step 112/500 | loss 1.0\n"]
    assert list(without_access_logs(["step 5/9 | eta 0m12" + entry, "\n"])) == \
        ["step 5/9 | eta 0m12\n"]  # the digits before the address stay
    assert list(without_access_logs([entry, "a\n"])) == ["a\n"]  # a whole entry: dropped
    assert list(without_access_logs(["phal" + entry, "anx\n"])) == ["phalanx\n"]
    assert list(without_access_logs(["last, no newline"])) == ["last, no newline"]


def test_an_ipv6_lighthouse_is_routed_to_over_ipv6():
    """`--lighthouse [v6]:PORT` is accepted: the groups' servers then listen on this
    machine's address towards it (was: an IPv4 socket, "no route" for every group)."""
    import socket

    from phalanx.ft.bind import listen_host

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(("::1", 29510))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    assert listen_host("http://[::1]:29510", local=False) == "::1"
    assert listen_host("http://127.0.0.1:29510", local=False) == "127.0.0.1"


class _Ended:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_a_group_restarted_after_another_finished_ends_instead_of_training_alone(
        tmp_path, capsys):
    """Seen under load: group 1, killed near the end, restarted after group 0 had finished
    the run; alone in its quorum it trained a second run from step 1. The launcher marks
    the group that finished; a group's next step ends with nothing to train."""
    from datetime import timedelta

    from phalanx.cluster.rendezvous import bound_store
    from phalanx.errors import FinishedElsewhere
    from phalanx.ft.groups import Groups
    from phalanx.ft.replica import ReplicaGroup, StartStore

    store = bound_store("127.0.0.1", 0)
    groups = Groups(["0", "1"], store, tmp_path)
    start = StartStore("127.0.0.1", store.port, ["0", "1"], timedelta(seconds=5))
    group1 = ReplicaGroup.__new__(ReplicaGroup)  # its quorum is not reached: no torchft here
    group1.group, group1.start, group1.result = "1", start, object()
    groups.procs = [_Ended(None), _Ended(None)]
    groups._mark_ended()
    assert start.finished_by() is None
    group1._finished_elsewhere()  # both training: nothing said
    groups.procs = [_Ended(0), _Ended(None)]  # group 0 finished the run
    groups._mark_ended()
    assert start.finished_by() == "0" and groups.winner == "0"
    with pytest.raises(FinishedElsewhere, match="replica group 0 has finished the run; "
                                                "group 1 .* has nothing left to train"):
        group1.begin_step(None)
    groups.procs = [_Ended(0), _Ended(0)]  # group 1 ended with 0 too: group 0 is named
    groups._mark_ended()
    assert _outcome([0, 0], [], ["0", "1"], [tmp_path, tmp_path], groups.winner) == (0, "0")
    assert "replica group 0 finished the run" in capsys.readouterr().out
    assert _outcome([0, 0], [], ["0", "1"], [tmp_path, tmp_path], "1") == (0, "1")
    assert "replica group 1 finished the run" in capsys.readouterr().out


def test_the_last_step_marks_the_run_finished_before_the_outputs_are_written(tmp_path,
                                                                              capsys):
    """Seen under load: group 0 took its last step and wrote its outputs (seconds); group 1,
    restarted from its checkpoint meanwhile, quorumed alone and trained on. The last step
    marks the run finished; the launcher names that group even when the other exits first."""
    from datetime import timedelta
    from types import SimpleNamespace

    from phalanx.cluster.rendezvous import bound_store
    from phalanx.errors import FinishedElsewhere
    from phalanx.ft.groups import Groups
    from phalanx.ft.replica import ReplicaGroup, StartStore

    store = bound_store("127.0.0.1", 0)
    start = StartStore("127.0.0.1", store.port, ["0", "1"], timedelta(seconds=5))
    group0, group1 = ReplicaGroup.__new__(ReplicaGroup), ReplicaGroup.__new__(ReplicaGroup)
    for group, name in ((group0, "0"), (group1, "1")):
        group.group, group.start, group.max_steps, group.out_dir = name, start, 10, None
        group.result = SimpleNamespace(state=SimpleNamespace(step=9))
    group0.stepped(None)  # step 9 of 10: not the last
    assert start.finished_by() is None
    group0.result.state.step = 10
    group0.stepped(None)
    assert start.finished_by() == "0"
    with pytest.raises(FinishedElsewhere):
        group1.begin_step(None)
    groups = Groups(["0", "1"], store, tmp_path)
    groups.procs = [_Ended(None), _Ended(0)]  # group 1 (nothing to train) exits first
    groups._mark_ended()
    assert groups.winner == "0"


def test_a_stop_is_the_whole_jobs_only_with_the_launchers_own_lighthouse(tmp_path):
    """Ctrl-C or a preemption's SIGTERM through the launcher: with its own lighthouse its
    groups are the job, and the stop is marked (every group stops after the same step);
    with a shared lighthouse (`--lighthouse`) it is not marked, so other machines' groups,
    which read the mark through the step's all-reduce, go on."""
    import signal
    from datetime import timedelta

    from phalanx.cluster.rendezvous import bound_store
    from phalanx.ft.groups import Groups
    from phalanx.ft.replica import StartStore

    for whole_job in (True, False):
        store = bound_store("127.0.0.1", 0)
        groups = Groups(["0", "1"], store, tmp_path, whole_job=whole_job)
        groups.procs = [_Ended(0), _Ended(0)]  # (nothing left to send the signal to)
        groups._forward(signal.SIGTERM, None)
        start = StartStore("127.0.0.1", store.port, ["0", "1"], timedelta(seconds=5))
        assert start.job_stopped() is whole_job and groups.signals == [signal.SIGTERM]


def test_a_heal_carries_the_fp16_loss_scale_and_its_growth_count():
    """A rejoining group must scale its loss as the live groups do: the all-reduce averages
    scaled gradients, which each group unscales by its own scale (a fresh scaler's 65536
    against a live 1024 would make the healed group's weights differ)."""
    import dataclasses
    from types import SimpleNamespace

    from phalanx.ft.replica import ReplicaGroup

    @dataclasses.dataclass
    class State:
        step: int = 0
        position: int = 0

    def group(scale: float) -> ReplicaGroup:
        g = ReplicaGroup.__new__(ReplicaGroup)
        scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=5)
        model = torch.nn.Linear(2, 2)
        g.run = SimpleNamespace(unwrap=lambda m: m, checkpoint_staged=lambda: None,
                                precision=SimpleNamespace(scaler=scaler),
                                loss_scaler=scaler)  # (Run.loss_scaler: precision's)
        g.result = SimpleNamespace(model=model, state=State(),
                                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return g

    live, back = group(1024.0), group(65536.0)
    live.run.precision.scaler._growth_tracker = torch.tensor(3, dtype=torch.int32)
    live.result.state = State(step=7, position=28)
    back._load(live._save())
    healed = back.run.precision.scaler
    assert healed.get_scale() == 1024.0 and healed._get_growth_tracker() == 3
    assert back.result.state == State(step=7, position=28) and back.healed
