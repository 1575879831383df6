"""The conformance task (common.py) trained with Phalanx's public API, resumed the way
README.md and docs/own-script.md say: `step = run.resume(ckpt, model, opt, loader=loader)`
before the loop, `run.save(ckpt, step, model, opt, loader=loader)` in it.

    python -m phalanx run --nproc-per-node 2 --out OUT \\
        benchmarks/conformance/phalanx_script.py --out OUT [common.parser() flags]

Under `phalanx run` its `--out` is the run directory (`run.out`); the script's own `--out`
(the same directory) is what common.parser() requires, and names `run.out` when the script
runs under torchrun or alone. StepLR's state goes in the checkpoint with
`stateful={"scheduler": sched}`, given to both `run.save` and `run.resume`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import phalanx  # noqa: E402


def build(run, args):
    """Model, optimizer (plain SGD, as in the peers' scripts), scheduler or None, loader,
    accumulator."""
    model, opt = run.setup(common.make_model(args.dropout),
                           lambda params: torch.optim.SGD(params, lr=args.lr))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7) \
        if args.scheduler else None
    loader = run.loader(common.IndexedData(), args.batch_size, shuffle=not args.no_shuffle,
                        num_workers=args.workers)
    return model, opt, sched, loader, run.accumulate(model, args.grad_accum)


def train(run, args) -> None:
    model, opt, sched, loader, acc = build(run, args)
    ckpt = run.out / "checkpoints"
    stateful = {"scheduler": sched} if sched is not None else None
    step = run.resume(ckpt, model, opt, loader=loader, stateful=stateful) if args.resume \
        else 0
    trace = common.Trace(args.out, run.rank, args.life)
    dying = False
    for _epoch in range(loader.epoch, args.epochs):
        for index, x, y in loader:
            with acc.micro_step():
                loss = common.loss_fn(model(x), y)
                acc.backward(loss)
            trace.micro(index, loss)
            if dying:  # optimizer step K + one micro-batch: as a preempted job ends
                common.kill_now()
            if not acc.boundary:
                continue
            run.step(opt)
            step += 1
            if sched is not None:
                sched.step()
            trace.step(step)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                run.save(ckpt, step, model, opt, loader=loader, stateful=stateful)
            dying = step == args.kill_after_step
    state = run.full_state_dict(model)  # every rank calls it; the weights on rank 0
    if run.is_main:
        common.save_final(args.out, state)


def main() -> None:
    args = common.parser("phalanx").parse_args()
    run = phalanx.init(seed=args.seed, strategy=args.strategy, out=args.out)
    with run:
        train(run, args)


if __name__ == "__main__":
    main()
