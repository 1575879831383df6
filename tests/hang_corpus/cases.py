"""The hang-and-straggler corpus (issue 46): small 2-rank (4 where the class needs it) gloo scripts, one per fault
class, each with the diagnosis a user needs — the culprit rank(s), the source line where
the ranks parted (the rank condition or the diverging call; "" when no line explains it),
the collective, and — where the stacks agree and the data differ — the cause in words.
Each script calls `mark()` just before its fault, so the time from the fault to the
report can be measured. A `healthy` case must produce no report at all (a false alarm is
scored). Scored by tests/hang_corpus/score.py; the `ci` sample runs in CI
(tests/e2e/test_hang_corpus.py)."""

from __future__ import annotations

from dataclasses import dataclass

# every script starts with these lines (the line numbers below count from the first)
HEAD = '''import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
def mark():
    open(f"mark-{rank}", "w").write(str(time.time()))
'''



def phalanx_head(strategy: str) -> str:
    """HEAD's 8 lines for a script on Phalanx's API (`run`, under `strategy`)."""
    return f'''import os, sys, time
import torch
import torch.distributed as dist, phalanx
run = phalanx.init(seed=0, strategy="{strategy}")
rank = run.rank
t = torch.ones(4)
def mark():
    open(f"mark-{{rank}}", "w").write(str(time.time()))
'''


@dataclass(frozen=True)
class Case:
    name: str
    body: str  # after HEAD (line 9 on)
    culprit: str  # "rank N" the report must name ("": none, or every rank is as much to blame)
    line: str  # "case.py:N" where the ranks parted ("" when none)
    collective: str  # the collective it must name ("" when none)
    cause: str = ""  # words the report must say when the stacks alone cannot tell it
    healthy: bool = False  # a slow but healthy run: no report is right
    ci: bool = False  # in CI's sample
    head: str = HEAD
    verdict: str = "right"  # as last scored (docs/doctor.md): a change either way is seen
    ranks: int = 2  # 4 where the class needs more than a pair

    def script(self) -> str:
        return self.head + self.body


CASES = [
    Case("skipped collective", '''mark()
if rank == 0:
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
''', "rank 0", "case.py:10", "all_reduce", ci=True),
    Case("extra collective", '''for step in range(3):
    dist.all_reduce(t)
mark()
if rank == 1:
    dist.broadcast(t, src=1)
time.sleep(60)
dist.destroy_process_group()
''', "rank 1", "case.py:12", "broadcast"),
    Case("collectives in different order", '''mark()
if rank == 0:
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
else:
    dist.broadcast(t, src=0)
    dist.all_reduce(t)
dist.destroy_process_group()
''', "rank 0", "case.py:10", "all_reduce"),
    Case("size mismatch", '''mark()
x = torch.ones(4 if rank == 0 else 5)
dist.all_reduce(x)
dist.destroy_process_group()
''', "", "case.py:10", "all_reduce", "sizes differ", verdict="partly"),
    Case("dtype mismatch", '''mark()
x = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
dist.all_reduce(x)
dist.destroy_process_group()
''', "", "case.py:10", "all_reduce", "dtypes differ", verdict="partly"),
    Case("data-dependent branch", '''mark()
value = torch.tensor([float(rank)])
if value.item() > 0.5:
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
''', "rank 1", "case.py:11", "all_reduce", verdict="partly"),
    Case("rank stuck in its data loader", '''def batches():
    while True:
        if rank == 1:
            time.sleep(3600)
        yield torch.ones(4)
mark()
for x in batches():
    dist.all_reduce(x)
''', "rank 1", "case.py:12", "all_reduce", ci=True),
    Case("exception on one rank", '''mark()
for step in range(3):
    if rank == 1 and step == 1:
        raise RuntimeError("bad batch")
    dist.all_reduce(t)
dist.destroy_process_group()
''', "rank 1", "case.py:12", "", ci=True),
    Case("rank killed", '''import signal
mark()
for step in range(3):
    if rank == 1 and step == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
dist.destroy_process_group()
''', "rank 1", "", ""),
    Case("straggler, not a hang", '''mark()
for step in range(6):
    if rank == 1:
        time.sleep(1.0)
    dist.all_reduce(t)
dist.destroy_process_group()
''', "", "", "", healthy=True, ci=True),
    Case("uneven inputs", '''mark()
for batch in range(3 if rank == 0 else 4):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
''', "rank 1", "case.py:10", "all_reduce"),
    Case("process groups created in different orders", '''mark()
if rank == 0:
    pair, single = dist.new_group([0, 1]), dist.new_group([1])
else:
    single, pair = dist.new_group([1]), dist.new_group([0, 1])
dist.all_reduce(t, group=pair)
dist.destroy_process_group()
''', "", "case.py:10", "new_group", verdict="partly"),
    Case("rank-0-only evaluation under DDP", '''model = run.setup(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(4):
    model(x).sum().backward()
    opt.step(); opt.zero_grad()
    if step == 1: mark()
    if run.is_main and step == 1:
        model.eval(); model(x); model.train()
''', "rank 0", "case.py:16", "broadcast", head=phalanx_head("ddp")),
    Case("rank-0-only evaluation under FSDP", '''model = run.setup(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    model(t).sum().backward()
    opt.step(); opt.zero_grad()
    if step == 1: mark()
    if run.is_main and step == 1:
        with torch.no_grad(): model(t)
''', "rank 0", "case.py:15", "all-gather", head=phalanx_head("fsdp"), ci=True),
    Case("rank-0-only checkpoint under ZeRO (DCP)", '''model, opt = run.setup(torch.nn.Linear(4, 4), lambda p: torch.optim.SGD(p, lr=0.1))
for step in range(4):
    model(t).sum().backward()
    run.step(opt)
    if step == 1: mark()
    if run.is_main and step == 1:
        run.save("ckpt", step, model, opt)
''', "rank 0", "case.py:14", "", head=phalanx_head("zero")),
    Case("rank-0-only evaluation under ZeRO", '''model, opt = run.setup(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)),
                       lambda p: torch.optim.SGD(p, lr=0.1))
x = torch.randn(8, 4)
for step in range(4):
    model(x).sum().backward()
    run.step(opt)
    if step == 1: mark()
    if run.is_main and step == 1:
        model.eval(); model(x); model.train()
''', "rank 0", "case.py:16", "broadcast", head=phalanx_head("zero")),
    Case("slow steps under the timeout", '''mark()
for step in range(3):
    time.sleep(3.0)  # every rank: a long step of its own work, then the collective
    dist.all_reduce(t)
dist.destroy_process_group()
''', "", "", "", healthy=True),
    Case("a receive nobody sends to", '''mark()
if rank == 0 and t.sum() > 100:  # (never true: the send is skipped)
    dist.send(t, dst=1)
if rank == 1:
    dist.recv(t, src=0)
dist.barrier()
dist.destroy_process_group()
''', "rank 0", "case.py:10", "recv", verdict="partly"),
    Case("one of four ranks skips a barrier", '''mark()
for step in range(2):
    dist.all_reduce(t)
if rank != 2:
    dist.barrier()
time.sleep(60)
dist.destroy_process_group()
''', "rank 2", "case.py:12", "barrier", ranks=4),
    Case("a subgroup collective one member skips", '''low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
mine = low if rank < 2 else high
mark()
if rank != 3:
    dist.all_reduce(t, group=mine)
time.sleep(60)
dist.destroy_process_group()
''', "rank 3", "case.py:12", "all_reduce", ranks=4),
]
