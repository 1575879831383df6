"""Worker for tests/dist/test_pipeline.py: pipeline parallelism on 4 gloo ranks, every
case on one process group, each case's mesh built for it.

- pp 2 × dp_shard 2 and pp 2 × tp 2, under GPipe and 1F1B: MiniGPT cut into two stages
  (`keep_stage`), FSDP2 or tensor parallelism inside each, 3 SGD steps (momentum 0.9) of one
  global batch (8 sequences, 4 micro-batches) with the gradient clipped over every stage
  (`pipeline_norm`); OUT/<case>/stage-<s>.pt: the stage's whole weights (gathered inside
  the stage) and the losses; OUT/<case>/dcp: the stages' sharded state as DCP saves it;
- dp_shard 4 (no pipeline): the same steps, the bound the tests derive their tolerance
  from (plain FSDP's difference from one process);
- the same through a script's API (`run.setup`, `run.forward_backward`, `run.step`,
  `run.full_state_dict`) under pp 2 × dp_shard 2, pp 2 × tp 2 and dp_shard 4
  (OUT/script-*/stage-0.pt: the whole weights on rank 0), and the pp × dp_shard script's
  step-2 checkpoint resumed under dp_shard 4 for the last step (OUT/resumed-dp4).
Usage: python pipeline_scenarios.py OUT
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import phalanx
from phalanx.models.minigpt import GPTConfig, MiniGPT
from phalanx.strategies import build, choose_for_script
from phalanx.strategies.topology import data_parallel
from phalanx.strategies import tensor_parallel
from phalanx.strategies.pipeline import Pipeline, check_stages, pipeline_norm

CFG = dict(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32, dropout=0.0,
           tie_embeddings=False)
GLOBAL, MICRO, STEPS, LR, CLIP = 8, 4, 3, 0.1, 0.5
CASES = {  # name: mesh dimensions (sizes), schedule
    "pp-dp-gpipe": (("pp", "dp_shard"), (2, 2), "gpipe"),
    "pp-dp-1f1b": (("pp", "dp_shard"), (2, 2), "1f1b"),
    "pp-tp-gpipe": (("pp", "tp"), (2, 2), "gpipe"),
    "pp-tp-1f1b": (("pp", "tp"), (2, 2), "1f1b"),
    "dp4": (("dp_shard",), (4,), None),
}
SCRIPTED = [  # name, schedule (None: no pipeline), phalanx.init's layout keywords
    ("script-pp-dp", "1f1b", {"pp": 2, "dp_shard": 2}),
    ("script-pp-tp", "gpipe", {"pp": 2, "tp": 2}),
    ("script-dp4", None, {"dp_shard": 4}),
]


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch, the same on every rank (and in the test's one process)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG["vocab_size"], (GLOBAL, CFG["block_size"]), generator=g)
    return x, torch.roll(x, -1, dims=1)


def model() -> MiniGPT:
    torch.manual_seed(0)
    return MiniGPT(GPTConfig(**CFG))


def run_case(out: Path, names: tuple[str, ...], sizes: tuple[int, ...], schedule) -> None:
    mesh = init_device_mesh("cpu", sizes, mesh_dim_names=names)
    net = model()
    stage = mesh["pp"].get_local_rank() if "pp" in names else 0
    if "pp" in names:
        check_stages(net, mesh["pp"].size())
        net.keep_stage(stage, mesh["pp"].size())
    if "tp" in names:
        net = tensor_parallel.split(net, mesh["tp"])
    if "dp_shard" in names:
        for block in net.blocks.values() if "pp" in names else net.blocks:
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(net, mesh=mesh["dp_shard"])
    dp = mesh["dp_shard"] if "dp_shard" in names else None
    share = GLOBAL // (dp.size() if dp is not None else 1)
    lo = (dp.get_local_rank() if dp is not None else 0) * share
    x, y = (t[lo:lo + share] for t in batch())
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    pipe = (Pipeline(net, mesh["pp"].get_group(), torch.device("cpu"), schedule=schedule,
                     microbatches=MICRO) if "pp" in names else None)
    losses, norms = [], []
    for _ in range(STEPS):
        if pipe is not None:
            loss = pipe.forward_backward(x, y)
        else:
            _, loss = net(x, y)
            loss.backward()
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        norm = tensor_parallel.total_norm(grads)
        if pipe is not None:
            norm = pipeline_norm(norm, pipe.group)
        for group in tensor_parallel._by_mesh([p for p in net.parameters()],
                                              lambda p: p.grad).values():
            torch.nn.utils.clip_grads_with_norm_(group, CLIP, norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach().float()
        if dp is not None:  # (each data-parallel rank's mean: the global batch's)
            dist.all_reduce(loss, group=dp.get_group())
            loss /= dp.size()
        losses.append(loss.item())
        norms.append(norm.item())
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    where = out
    first_of_stage = all(mesh[d].get_local_rank() == 0 for d in names if d != "pp")
    if first_of_stage:
        torch.save({"state": {k: v.clone() for k, v in full.items()}, "losses": losses,
                    "norms": norms}, where / f"stage-{stage}.pt")
    dcp.save({"model": get_model_state_dict(net)}, checkpoint_id=str(where / "dcp"))


@contextlib.contextmanager
def laid_out(run, **dims):
    """`run` under the fsdp strategy on the mesh `dims` give (as `phalanx.init(**dims)`
    builds it: the mesh, the data-parallel rank and size)."""
    choice = choose_for_script("fsdp", run.world_size, **dims)
    t = run.topology
    topology = data_parallel(t.rank, t.local_rank, t.world_size, t.local_world_size,
                             t.device, t.backend, t.launcher, layout=choice.layout)
    saved = run.strategy, run.topology
    run.strategy, run.topology = build(choice, topology), topology
    try:
        yield
    finally:
        run.strategy, run.topology = saved


def scripted(run, out: Path, schedule: str | None, resume: Path | None = None, **dims) -> None:
    """A script's loop on the public API — `run.setup`, `run.forward_backward`,
    `run.clip_grad_norm_`, `run.step`, `run.save`, `run.full_state_dict` — under `dims`;
    it commits a checkpoint after step 2; with `resume`, it resumes the newest there first."""
    with laid_out(run, **dims):
        net, opt = run.setup(model(), lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9))
        t = run.topology
        share = GLOBAL // t.dp_size
        x, y = (part[t.dp_rank * share:(t.dp_rank + 1) * share] for part in batch())
        losses, norms = [], []
        steps = run.resume(resume, net, opt) if resume is not None else 0
        for step in range(steps + 1, STEPS + 1):
            # (without a pipeline: 2 micro-batches of one row, run.accumulate's path)
            loss = run.forward_backward(net, x, y, microbatches=MICRO if schedule else 2,
                                        schedule=schedule or "1f1b")
            norms.append(run.clip_grad_norm_(net, CLIP).item())
            run.step(opt)
            losses.append(run.all_reduce_mean(loss.item()))
            if step == STEPS - 1 and resume is None:  # (the step the resume starts from)
                run.save(out / "checkpoints", step, net, opt)
        state = run.full_state_dict(net)
        if run.is_main:
            torch.save({"state": {k: v.clone() for k, v in state.items()}, "losses": losses,
                        "norms": norms}, out / "stage-0.pt")


def main() -> None:
    out = Path(sys.argv[1])
    with phalanx.init(seed=7, threads=1) as run:
        for name, (names, sizes, schedule) in CASES.items():
            (out / name).mkdir(parents=True, exist_ok=True)
            run_case(out / name, names, sizes, schedule)
            dist.barrier()
        for name, schedule, dims in SCRIPTED:
            (out / name).mkdir(parents=True, exist_ok=True)
            scripted(run, out / name, schedule, **dims)
        # the pp 2 × dp_shard 2 script's checkpoint, resumed under dp_shard 4
        (out / "resumed-dp4").mkdir(exist_ok=True)
        scripted(run, out / "resumed-dp4", None, out / "script-pp-dp" / "checkpoints",
                 dp_shard=4)


if __name__ == "__main__":
    main()
