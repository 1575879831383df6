"""A helper handed a wrapped model runs its collective (lint.model_args): an FSDP model
evaluated on rank 0 through `evaluate(model, batch)` defined in another file is PX301,
whatever the helper calls its parameter; each silent case beside the one found. And the
sentence a hang or abort report adds from those findings (lint.divergence)."""

from __future__ import annotations

import os
from pathlib import Path

from phalanx.lint.divergence import citation, parting_findings
from phalanx.lint.engine import lint_source
from phalanx.lint.project import build_project
from phalanx.lint.rules import ALL

TRAIN = '''import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
{imports}
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(8, 4)
{wrap}
for step in range(6):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    if rank == 0 and step % 2 == 1:
        print({call})
dist.destroy_process_group()
'''

EVALUATION = '''import torch


def evaluate(net, batch):
    with torch.no_grad():
        return net(batch).sum().item()


def count(net, batch):
    return sum(p.numel() for p in net.parameters()) + len(batch)


def shard_names(net):
    return list(net.state_dict())
'''


def codes(tmp_path: Path, call: str, wrap: str = "fully_shard(model)",
          imports: str = "from evaluation import count, evaluate, shard_names\n",
          evaluation: str = EVALUATION) -> list[tuple[str, int, str]]:
    (tmp_path / "train.py").write_text(TRAIN.format(imports=imports, wrap=wrap, call=call))
    (tmp_path / "evaluation.py").write_text(evaluation)
    paths = sorted(tmp_path.glob("*.py"))
    project = build_project(paths)
    train = tmp_path / "train.py"
    return [(f.code, f.line, f.message) for f in
            lint_source(str(train), train.read_text(), ALL, project)
            if f.code in ("PX301", "PX302", "PX303")]


def test_an_fsdp_model_evaluated_on_rank_0_in_another_files_helper(tmp_path: Path):
    [(code, line, message)] = codes(tmp_path, "evaluate(model, torch.randn(4, 8))")
    assert (code, line) == ("PX303", 14)  # a model's forward: not a proven collective
    assert "the forward of the FSDP model `model` in `evaluate()` (all-gathers parameters)" \
        in message and "under `if rank == 0 and step % 2 == 1:` at line 13" in message


def test_by_keyword_and_through_a_module(tmp_path: Path):
    found = codes(tmp_path, "ev.evaluate(batch=None, net=model)",
                  imports="import evaluation as ev\n")
    assert [c for c, _, _ in found] == ["PX303"]


def test_an_fsdp_state_dict_asked_by_a_helper(tmp_path: Path):
    [(code, _, message)] = codes(tmp_path, "shard_names(model)")
    assert code == "PX303" and "`model.state_dict()` of an FSDP model" in message


def test_silent_where_nothing_runs_the_model(tmp_path: Path):
    assert codes(tmp_path, "count(model, [1])") == []  # parameters(): no collective
    assert codes(tmp_path, "evaluate(torch.nn.Linear(8, 4), None)") == []  # not wrapped
    assert codes(tmp_path, "evaluate(model, None)", wrap="") == []  # never sharded


def test_a_ddp_models_state_dict_is_no_collective_and_its_forward_a_warning(tmp_path: Path):
    ddp = "model = torch.nn.parallel.DistributedDataParallel(model)"
    assert codes(tmp_path, "shard_names(model)", wrap=ddp) == []
    assert [c for c, _, _ in codes(tmp_path, "evaluate(model, None)", wrap=ddp)] == ["PX302"]


def test_a_helper_that_replaces_its_parameter_first_is_silent(tmp_path: Path):
    replaced = EVALUATION.replace("    with torch.no_grad():\n",
                                  "    net = torch.nn.Identity()\n    with torch.no_grad():\n")
    assert codes(tmp_path, "evaluate(model, None)", evaluation=replaced) == []


def test_the_citation_a_report_adds(tmp_path: Path):
    codes(tmp_path, "evaluate(model, torch.randn(4, 8))")
    os.mkfifo(tmp_path / "pipe.py")  # a FIFO (never read: it would block) and a missing
    files = [str(tmp_path / "train.py"), str(tmp_path / "evaluation.py"),  # file are left out
             str(tmp_path / "pipe.py"), str(tmp_path / "missing.py"), str(tmp_path / "train.py")]
    found = parting_findings(files)
    assert [(f.code, Path(f.path).name, f.line) for f in found] == [("PX303", "train.py", 14)]
    said = citation(found, short=lambda p: Path(p).name)
    assert said == ("`phalanx lint --select PX303` finds where the ranks part: train.py:14 "
                    "(PX303): the "
                    "forward of the FSDP model `model` in `evaluate()` (all-gathers "
                    "parameters) under `if rank == 0 and step % 2 == 1:` at line 13: the "
                    "other ranks never join it."), said
    assert citation([]) == ""
