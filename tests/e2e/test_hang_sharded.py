"""Hang reports that name the collective behind the call, on 2 gloo ranks under `phalanx
watch`: an FSDP2 model evaluated only on rank 0 between epochs, DDP with one batch more
on rank 1 (uneven inputs), ZeroRedundancyOptimizer.consolidate_state_dict only on rank 0,
and a DDP forward (its bucket rebuild) only on rank 0. Each report must come within the
timeout + 10 s of the last rank's last progress (each script marks the time just before
its blocking call; the report file's time is when it came)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from test_hang import watch

TIMEOUT = 4
MARK = '''import time
import torch
import torch.distributed as dist


def mark(rank):  # the test times the report from the last rank's last mark
    with open(f"mark-rank{rank}", "w") as f:
        f.write(str(time.time()))


'''

def fsdp2_model(mesh: str = "") -> str:
    """An FSDP2 model and a helper in another file that evaluates it (EVALUATION below);
    `mesh`: the shape of a 2-D (dp_replicate, dp_shard) device mesh to shard it on (HSDP),
    or none (FSDP over the world)."""
    on = ", mesh=mesh" if mesh else ""
    imports = "from torch.distributed.device_mesh import init_device_mesh\n" if mesh else ""
    build = (f'mesh = init_device_mesh("cpu", {mesh}, '
             f'mesh_dim_names=("dp_replicate", "dp_shard"))\n' if mesh else "")
    return imports + f'''from torch.distributed.fsdp import fully_shard

from evaluation import evaluate

dist.init_process_group("gloo")
rank = dist.get_rank()
{build}torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
for layer in (model[0], model[2]):
    fully_shard(layer{on})
fully_shard(model{on})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
'''


FSDP2_MODEL = fsdp2_model()
EVAL_ON_RANK_0_EACH_EPOCH = '''for epoch in range(3):
    for step in range(2):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    mark(rank)
    if rank == 0:
        print("eval loss", evaluate(model, torch.randn(4, 8)))
    dist.barrier()
dist.destroy_process_group()
'''

FSDP2_EVAL_ON_RANK_0 = MARK + FSDP2_MODEL + EVAL_ON_RANK_0_EACH_EPOCH

EVALUATION = '''import torch


def evaluate(model, batch):
    with torch.no_grad():
        return model(batch).sum().item()
'''

DDP_UNEVEN = MARK + '''from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(4, 8) for _ in range(3 + rank)]  # rank 1 has one batch more
for batch in batches:
    mark(rank)
    loss = model(batch).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
mark(rank)
dist.barrier()
dist.destroy_process_group()
'''

ZERO_CONSOLIDATE_ON_RANK_0 = MARK + '''from torch.distributed.optim import ZeroRedundancyOptimizer

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)


def save_checkpoint(optimizer):
    optimizer.consolidate_state_dict(to=0)
    torch.save(optimizer.state_dict(), "opt.pt")


for step in range(2):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
mark(rank)
if rank == 0:
    save_checkpoint(opt)
dist.barrier()
dist.destroy_process_group()
'''

DDP_FORWARD_ON_RANK_0 = MARK + '''from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                          torch.nn.Linear(16, 4))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mark(rank)
    if rank == 0:
        print("probe", model(torch.randn(4, 8)).mean().item())
    dist.barrier()
dist.destroy_process_group()
'''


def _at(source: str, text: str) -> str:
    """`train.py:N`, the first line of `source` that contains `text`."""
    return f"train.py:{next(i for i, line in enumerate(source.splitlines(), 1) if text in line)}"


def _hang(tmp_path: Path, source: str, **files: str) -> tuple[str, str]:
    """Run `source` as train.py on 2 ranks; (the report, stderr), with the timing
    checked."""
    (tmp_path / "train.py").write_text(source)
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    started = time.monotonic()
    proc = watch(tmp_path / "train.py", "--hang-timeout-s", str(TIMEOUT), cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-2000:]
    path = tmp_path / "hang-report.txt"
    report = path.read_text()
    stuck = max(float((tmp_path / f"mark-rank{r}").read_text()) for r in (0, 1))
    assert path.stat().st_mtime - stuck < TIMEOUT + 10, (path.stat().st_mtime - stuck, report)
    assert elapsed < 60, elapsed
    return report, proc.stderr


def test_fsdp2_evaluated_on_rank_0_names_the_all_gather_and_the_condition(tmp_path):
    src = FSDP2_EVAL_ON_RANK_0
    report, stderr = _hang(tmp_path, src, evaluation=EVALUATION)
    cause = (f"rank(s) 0 are in FSDP all-gather in the forward of `model` at evaluation.py:6 "
             f"in evaluate() (called from {_at(src, 'evaluate(model')}), reached only under "
             f"`if rank == 0:` at {_at(src, 'if rank == 0')}; rank 1 is in barrier at "
             f"{_at(src, 'barrier()')} in <module>() — they never join it.")
    assert f"Most likely cause: {cause}" in report, report
    assert cause in stderr
    assert "DDP" not in report


def test_uneven_inputs_with_ddp_say_who_ran_more_and_the_fix(tmp_path):
    src = DDP_UNEVEN
    report, _ = _hang(tmp_path, src)
    backward = _at(src, "loss.backward()")
    assert f"rank 1: in DDP gradient all-reduce in the backward at {backward}" in report
    assert (f"Most likely cause: uneven inputs: rank 0 left the loop at "
            f"{_at(src, 'for batch in')} and is in barrier at {_at(src, 'barrier()')} in "
            f"<module>(), while rank 1 is still in it, in DDP gradient all-reduce in the "
            f"backward at {backward} in <module>() — the ranks ran a different number of "
            f"iterations and rank 1 ran more (optimizer steps taken: rank 0: 3, rank 1: 3; "
            f"rank 1 is in iteration 4).") in report, report
    assert "drop_last=True" in report and "torch.distributed.algorithms.Join" in report


def test_zero_consolidate_state_dict_on_rank_0_only_is_named(tmp_path):
    src = ZERO_CONSOLIDATE_ON_RANK_0
    report, _ = _hang(tmp_path, src)
    assert (f"Most likely cause: rank(s) 0 are in ZeroRedundancyOptimizer.consolidate_state_"
            f"dict's broadcast of optimizer state at {_at(src, 'consolidate_state_dict(')} in "
            f"save_checkpoint() (called from {_at(src, 'save_checkpoint(opt)')}), reached only "
            f"under `if rank == 0:` at {_at(src, 'if rank == 0')}; rank 1 is in barrier at "
            f"{_at(src, 'barrier()')} in <module>()") in report, report


def test_a_ddp_forward_on_rank_0_only_names_the_bucket_rebuild(tmp_path):
    src = DDP_FORWARD_ON_RANK_0
    report, _ = _hang(tmp_path, src)
    assert (f"Most likely cause: rank(s) 0 are in DDP bucket rebuild (broadcast) in the "
            f"forward of `model` at {_at(src, 'probe')} in <module>(), reached only under "
            f"`if rank == 0:` at {_at(src, 'if rank == 0')}; rank 1 is in barrier at "
            f"{_at(src, 'barrier()')}") in report, report


DDP_UNEVEN_TO_THE_END = DDP_UNEVEN.replace("mark(rank)\ndist.barrier()\n", "")


def test_uneven_inputs_to_the_script_end_are_named_by_the_rank_left_behind(tmp_path):
    """gloo fails the longer rank's all-reduce at once when the other rank's script ends
    ("Connection closed by peer"): that rank's error says uneven inputs, not a crash."""
    src = DDP_UNEVEN_TO_THE_END
    (tmp_path / "train.py").write_text(src)
    proc = watch(tmp_path / "train.py", "--hang-timeout-s", str(TIMEOUT), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert (f"uneven inputs: rank 0 finished the script while rank 1 was still in DDP "
            f"gradient all-reduce in the backward at {_at(src, 'loss.backward()')} in "
            f"<module>() — rank 1 ran more iterations (optimizer steps taken: rank 0: 3, "
            f"rank 1: 3; rank 1 is in iteration 4).") in last, last
    assert "drop_last=True" in (tmp_path / "logs" / "rank-1.log").read_text()


# the issue's case: the evaluation between steps, no barrier after it: rank 0's evaluation
# all-gathers pair with rank 1's next training ones (same sizes), and gloo aborts later,
# where the ranks met — a line away from where they parted
FSDP2_EVAL_BETWEEN_STEPS = '''import torch
import torch.distributed as dist
''' + FSDP2_MODEL + '''for step in range(6):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if rank == 0 and step % 2 == 1:
        print("eval loss", evaluate(model, torch.randn(4, 8)))
dist.destroy_process_group()
'''


def test_an_abort_where_the_ranks_met_cites_lint_for_where_they_parted(tmp_path):
    src = FSDP2_EVAL_BETWEEN_STEPS
    (tmp_path / "train.py").write_text(src)
    (tmp_path / "evaluation.py").write_text(EVALUATION)
    proc = watch(tmp_path / "train.py", "--hang-timeout-s", "20", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "exited with code -6 (killed by signal 6) in FSDP all-gather" in last, last
    assert (f"`phalanx lint --select PX303` finds where the ranks part: "
            f"{_at(src, 'evaluate(model')} (PX303): the forward of the FSDP model `model` in `evaluate()` (all-gathers "
            f"parameters) under `if rank == 0 and step % 2 == 1:` at line "
            f"{_at(src, 'if rank == 0').split(':')[1]}: the other ranks never join it") in last


HSDP_EVAL_ON_RANK_0 = MARK + fsdp2_model(mesh="(2, 2)") + EVAL_ON_RANK_0_EACH_EPOCH


def test_an_hsdp_hang_names_the_mesh_dimension_rank_0_waits_in(tmp_path):
    """HSDP on 4 ranks (2 replica groups × 2 shards), evaluated on rank 0 only, with torch's
    flight recorder on (TORCH_FR_BUFFER_SIZE, gloo records too): rank 0 waits in the
    all-gather of its dp_shard group, the others in the world's barrier (issue 44)."""
    src = HSDP_EVAL_ON_RANK_0
    (tmp_path / "train.py").write_text(src)
    (tmp_path / "evaluation.py").write_text(EVALUATION)
    proc = subprocess.run([sys.executable, "-m", "phalanx", "watch", "--nproc-per-node", "4",
                           "--report-dir", str(tmp_path), "--hang-timeout-s", str(TIMEOUT),
                           "train.py"], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1",
                                             "TORCH_FR_BUFFER_SIZE": "2000"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = (tmp_path / "hang-report.txt").read_text()
    assert ("rank 0: in FSDP all-gather in the forward of `model` at evaluation.py:6 in "
            f"evaluate(), under `if rank == 0:` at {_at(src, 'if rank == 0')}" in report), report
    assert "the device mesh's dp_shard dimension; in-process)" in report, report
    lines = [line for line in report.splitlines() if line.startswith("  rank 0: #")]
    assert len(lines) == 1 and "all_gather" in lines[0] and "mesh_dp_shard" in lines[0], lines
    assert all(f"  rank {r}: in barrier at {_at(src, 'barrier()')}" in report
               for r in (1, 2, 3)), report
