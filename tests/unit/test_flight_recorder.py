"""torch's NCCL flight recorder folded into the hang report — on CPU, from dump files
crafted in torch's own format (checked against torch's analyser, which reads them)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
from torch.distributed.flight_recorder.components.loader import read_dump

from phalanx.hang import flight_recorder as fr
from phalanx.hang.diagnosis import build_report
from phalanx.hang.stacks import Frame
from phalanx.hang.watchdog import HANG_EXIT_CODE, REPORT_NAME, _stack_answer


def entry(seq: int, state: str, op: str = "all_reduce", sizes=((1024, 768),),
          record: int | None = None, backend: str = "nccl") -> dict:
    """One entry as FlightRecorder.hpp writes it (the keys torch's analyser reads)."""
    return {"record_id": seq if record is None else record, "pg_id": 0,
            "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "is_p2p": False, "op_id": seq,
            "profiling_name": f"{backend}:{op}", "time_created_ns": 1_000 * seq,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"],
            "output_sizes": [list(s) for s in sizes], "output_dtypes": ["Float"],
            "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600_000, "frames": []}


def dump(*entries: dict) -> dict:
    return {"version": "2.10", "entries": list(entries), "pg_status": {},
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}}


def write(prefix: str, rank: int, data: dict) -> str:
    path = f"{prefix}{rank}"
    with open(path, "wb") as fh:
        pickle.dump(data, fh)
    return path


def hung_pair(prefix: str) -> None:
    """Rank 0 waits in all_reduce #3; rank 1 finished #2 and never entered #3."""
    write(prefix, 0, dump(entry(1, "completed"), entry(2, "completed"), entry(3, "started")))
    write(prefix, 1, dump(entry(1, "completed"), entry(2, "completed")))


def test_the_crafted_dump_is_what_torchs_analyser_reads(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    path = write(prefix, 1, dump(entry(1, "completed")))
    read = read_dump(os.path.basename(prefix), path)  # torch's own loader
    assert read["rank"] == 1 and read["entries"][0]["profiling_name"] == "nccl:all_reduce"


def test_each_ranks_last_collective_and_who_never_entered(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    hung_pair(prefix)
    found = fr.read_dumps(2, prefix)
    assert (found[0].seq, found[0].op, found[0].state) == (3, "all_reduce", "started")
    assert (found[1].seq, found[1].state) == (2, "completed")
    lines = fr.section(2, prefix=prefix)
    text = "\n".join(lines)
    assert "rank 0: #3 all_reduce [1024x768] started (group 0:default_pg" in text
    assert "rank 1: #2 all_reduce [1024x768] completed" in text
    assert "the others wait in #3; rank 1 is at #2 (completed): they never entered" in text


def test_the_oldest_unfinished_collective_is_the_one_waited_in():
    d = dump(entry(4, "completed"), entry(5, "started"), entry(6, "scheduled"))
    last = fr.last_collective(d, 0, "x")
    assert last is not None and (last.seq, last.state) == (5, "started")
    assert fr.last_collective(dump(), 0, "x") is None


def test_gloo_entries_stay_scheduled_so_the_newest_is_taken():
    d = dump(*(entry(i, "scheduled", backend="gloo") for i in (1, 2, 3)))
    last = fr.last_collective(d, 0, "x")
    assert last is not None and (last.seq, last.state) == (3, "scheduled")


GLOO = textwrap.dedent("""
    import json, torch, torch.distributed as dist
    from phalanx.hang import flight_recorder as fr
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(1234))
    print(json.dumps(fr.own_last(0)), flush=True)
    dist.destroy_process_group()  # (left to exit, gloo's threads once aborted it: -6)
""")


def test_a_rank_reads_its_own_recorder_in_process(tmp_path):
    """torch records gloo's collectives too (`_dump_fr_trace`): the path a GPU job takes
    with `_dump_nccl_trace`, run for real on CPU."""
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100"}
    proc = subprocess.run([sys.executable, "-c", GLOO], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (last["op"], last["seq"], last["input_sizes"]) == ("all_reduce", 1, [[1234]])
    assert last["source"] == "in-process" and last["group"] == "0:default_pg"


def test_a_dump_older_than_the_job_and_a_missing_rank(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    hung_pair(prefix)
    old = time.time() - 3600
    os.utime(f"{prefix}1", (old, old))  # another job's file
    lines = fr.section(3, prefix=prefix, since=time.time() - 60)
    text = "\n".join(lines)
    assert "rank 0: #3" in text and "rank 1:" not in text
    assert "no record from rank(s) 1, 2" in text
    assert fr.section(2, prefix=str(tmp_path / "none_")) == []  # no files: no section


def test_in_process_answers_take_precedence_over_files(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    hung_pair(prefix)
    answer = fr.LastCollective(1, 3, "all_reduce", "scheduled", [[8]], "0:default_pg",
                               "in-process").__dict__
    text = "\n".join(fr.section(2, {1: answer, 0: None, 2: {"odd": 1}}, prefix=prefix))
    assert "rank 1: #3 all_reduce [8] scheduled (group 0:default_pg; in-process)" in text
    assert "never entered" not in text


def test_a_device_mesh_group_is_named_by_its_dimension():
    """DeviceMesh's groups (HSDP's) are described `mesh_<dimension>` by torch."""
    answer = fr.LastCollective(0, 13, "all_gather", "scheduled", [[72]], "3:mesh_dp_shard",
                               "in-process")
    assert answer.line() == ("  rank 0: #13 all_gather [72] scheduled (group 3:mesh_dp_shard, "
                             "the device mesh's dp_shard dimension; in-process)")
    assert fr.mesh_dimension("0:default_pg") == "" and fr.mesh_dimension("7") == ""


def test_the_recorder_is_off_without_a_buffer_and_own_dump_never_raises(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert not fr.enabled() and fr.own_dump() is None
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    assert fr.enabled()
    fr.own_dump()  # None on a CPU build; a dict with NCCL: either way, no exception
    assert '"flight": ' in _stack_answer(0)
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/x/trace_")
    assert fr.prefix_from_env() == "/x/trace_"


def test_the_report_carries_the_section(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    hung_pair(prefix)
    frame = Frame(file="/u/train.py", line=3, function="main", code="dist.all_reduce(t)")
    text, _ = build_report({0: [frame], 1: [frame]}, {}, 5.0, 2,
                           flight=fr.section(2, prefix=prefix))
    assert "torch's flight recorder" in text
    assert text.index("Most likely cause") < text.index("torch's flight recorder") < \
        text.index("Stacks (user code")


WATCHED = textwrap.dedent("""
    import pickle, sys, time
    import torch.distributed as dist
    from phalanx.hang.watchdog import Watchdog
    sys.path.insert(0, sys.argv[3])
    from test_flight_recorder import dump, entry
    Watchdog(dist.HashStore(), 0, 1, 1.0, sys.argv[1], poll=0.2).start()
    with open(sys.argv[2] + "0", "wb") as fh:  # written after the watchdog started
        pickle.dump(dump(entry(7, "completed"), entry(8, "started", "broadcast")), fh)
    time.sleep(60)  # hung (the stack does not change)
""")


def test_a_hung_process_report_includes_its_dump(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    env = {**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    proc = subprocess.run([sys.executable, "-c", WATCHED, str(tmp_path), prefix,
                           os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-2000:]
    report = (tmp_path / REPORT_NAME).read_text()
    assert "rank 0: #8 broadcast [1024x768] started (group 0:default_pg; " \
           f"{prefix}0)" in report


WATCHED_GLOO = textwrap.dedent("""
    import sys, time, torch
    import torch.distributed as dist
    from phalanx.hang.watchdog import Watchdog
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(1234))
    Watchdog(dist.HashStore(), 0, 1, 1.0, sys.argv[1], poll=0.2).start()
    time.sleep(60)  # hung after its last collective
""")


def test_a_hung_process_report_includes_its_in_process_record(tmp_path):
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "none_")}
    proc = subprocess.run([sys.executable, "-c", WATCHED_GLOO, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == HANG_EXIT_CODE, proc.stderr[-2000:]
    report = (tmp_path / REPORT_NAME).read_text()
    assert "rank 0: #1 all_reduce [1234] scheduled (group 0:default_pg; in-process)" in report
    # its dump, written as NCCL's timeout would write one, is what torch's analyser reads
    assert f"each rank's dump: {tmp_path / 'none_'}<rank>" in report
    assert read_dump("none_", str(tmp_path / "none_0"))["pg_config"]["0"]["name"] == "0"
    analysed = subprocess.run([sys.executable, "-m",
                               "torch.distributed.flight_recorder.fr_trace", str(tmp_path),
                               "-p", "none_"], capture_output=True, text=True,
                              timeout=60)
    assert analysed.returncode == 0 and "Traceback" not in analysed.stderr, analysed.stderr


def test_gloos_unnamed_default_group_is_named_as_its_entries_name_it():
    gloo = {**dump(entry(1, "scheduled", backend="gloo")),
            "pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}}
    assert fr._named_groups(gloo)["pg_config"] == {
        "0": {"name": "0", "desc": "", "ranks": "[0, 1]"}}
    named = dump(entry(1, "completed"))
    assert fr._named_groups(named)["pg_config"] == dump()["pg_config"]  # left as it was


class _Planted:
    """A pickle that would call a function when loaded (what a planted file could do)."""

    def __reduce__(self):
        return (os.system, ("echo planted",))


def test_a_dump_naming_a_function_or_not_ours_is_skipped_unread(tmp_path):
    prefix = str(tmp_path / "nccl_trace_rank_")
    hung_pair(prefix)
    with open(f"{prefix}0", "wb") as fh:  # rank 0's file: plain data plus a callable
        pickle.dump({**dump(entry(3, "started")), "x": _Planted()}, fh)
    with pytest.raises(pickle.UnpicklingError, match="not plain data"):
        fr.load_plain(open(f"{prefix}0", "rb").read())
    os.replace(f"{prefix}1", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", f"{prefix}1")  # a link: not a dump this job wrote
    assert fr.read_dumps(2, prefix) == {}
    os.unlink(f"{prefix}1")
    os.replace(tmp_path / "elsewhere", f"{prefix}1")
    assert set(fr.read_dumps(2, prefix)) == {1}  # the plain, own file is read


def test_the_dumps_line_names_only_the_ranks_that_wrote_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(tmp_path / "d_"))
    answer = {"rank": 0, "seq": 3, "op": "all_reduce", "state": "started",
              "input_sizes": [[4]], "group": "0:default_pg", "source": "in-process"}
    none = fr.section(2, {0: answer, 1: answer})
    assert not any("dump:" in line for line in none)  # nobody wrote one: no line
    some = "\n".join(fr.section(2, {0: answer, 1: answer}, dumped=[1]))
    assert f"rank(s) 1's (the others wrote none) dump: {tmp_path / 'd_'}<rank>" in some
    every = "\n".join(fr.section(2, {0: answer, 1: answer}, dumped=[0, 1]))
    assert f"each rank's dump: {tmp_path / 'd_'}<rank>" in every
