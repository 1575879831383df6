"""Conformance script: Hugging Face Accelerate (benchmarks/conformance; see common.py).

Written the way Accelerate's docs save and resume:
- https://huggingface.co/docs/accelerate/usage_guides/checkpoint (`save_state` /
  `load_state`; "Restoring the state of the DataLoader": `skip_first_batches`, or, with
  `use_stateful_dataloader=True`, `load_state` alone);
- examples/complete_nlp_example.py and examples/by_feature/checkpointing.py: the script
  counts its own steps, names each checkpoint folder `step_{n}`, and on resume derives
  the starting epoch and the batches to skip from that name (with accumulation the name
  counts optimizer steps and is multiplied by the accumulation, as in transformers'
  examples/pytorch/*/run_*_no_trainer.py, Accelerate's flagship scripts);
- https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation
  (`accelerator.accumulate`, step the optimizer and scheduler every micro-batch: the
  prepared objects only act when `accelerator.sync_gradients`).

`--scheduler`: a prepared scheduler steps `num_processes` times per optimizer step by
default (accelerate/scheduler.py, AcceleratedScheduler.step); the scenario asks for one
step per optimizer step, so the Accelerator is built with the documented
`step_scheduler_with_optimizer=False` and the script steps it when `sync_gradients`.

`accelerate_stateful_script.py` runs the same code with
`DataLoaderConfiguration(use_stateful_dataloader=True)` and no `skip_first_batches`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration, DistributedType
from accelerate.utils import FullyShardedDataParallelPlugin, set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def latest_checkpoint(directory: Path, library: str) -> Path | None:
    """The `step_{n}` folder with the largest n (the examples sort by name or ctime)."""
    folders = [p for p in directory.glob("step_*") if p.is_dir()] if directory.is_dir() else []
    return common.latest_or_fresh(folders, lambda p: int(p.name.split("_")[1]), library,
                                  directory)


def main(stateful: bool = False) -> None:
    library = "accelerate-stateful" if stateful else "accelerate"
    args = common.parser(library).parse_args()
    out = Path(args.out)
    checkpoints = out / "checkpoints"

    fsdp_plugin = None
    if args.strategy == "fsdp":
        fsdp_plugin = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=args.grad_accum,
        step_scheduler_with_optimizer=False,
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful),
        fsdp_plugin=fsdp_plugin,
    )
    if args.strategy == "fsdp" and accelerator.distributed_type != DistributedType.FSDP:
        # accelerate/state.py switches to FSDP only from the GPU-type multi-process
        # types; on CPU (MULTI_CPU) the plugin is ignored and training would be DDP.
        common.refuse(f"Accelerate runs FSDP only on GPU-type devices; on CPU the "
                      f"fsdp_plugin is ignored (distributed_type={accelerator.distributed_type})")
    set_seed(args.seed)
    rank = accelerator.process_index
    trace = common.Trace(out, rank, args.life)

    model = common.make_model(args.dropout)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # As the docs' examples: no generator of our own; `prepare` gives the sampler one,
    # seeded from the torch RNG that `set_seed` seeded (accelerate/data_loader.py,
    # prepare_data_loader), and keeps it in step across processes.
    loader = DataLoader(common.IndexedData(), batch_size=args.batch_size,
                        shuffle=not args.no_shuffle, num_workers=args.workers)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                              scheduler)

    # The docs' examples track the step themselves and name the folder after it.
    completed_steps, starting_epoch, resume_batches = 0, 0, 0
    if args.resume:
        path = latest_checkpoint(checkpoints, library)
        if path is not None:
            accelerator.print(f"Resumed from checkpoint: {path}")
            accelerator.load_state(str(path))
            completed_steps = int(path.name.split("_")[1])
            # As the examples do: batches seen -> epoch and batches into it.
            batches = completed_steps * args.grad_accum
            starting_epoch = batches // len(loader)
            resume_batches = batches - starting_epoch * len(loader)

    kill_pending = False
    for epoch in range(starting_epoch, args.epochs):
        model.train()
        if epoch == starting_epoch and resume_batches and not stateful:
            active = accelerator.skip_first_batches(loader, resume_batches)
        else:
            active = loader
        for indices, x, y in active:
            with accelerator.accumulate(model):
                loss = common.loss_fn(model(x), y)
                accelerator.backward(loss)
                trace.micro(indices, loss)
                if kill_pending:
                    common.kill_now()
                optimizer.step()
                if accelerator.sync_gradients and args.scheduler:
                    scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed_steps += 1
                trace.step(completed_steps)
                if args.checkpoint_every and completed_steps % args.checkpoint_every == 0:
                    accelerator.save_state(str(checkpoints / f"step_{completed_steps}"))
                if completed_steps == args.kill_after_step:
                    kill_pending = True
    if kill_pending:  # step K was the last one: nothing left to run
        common.kill_now()

    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)  # gathers the full state dict under FSDP
    if accelerator.is_main_process:
        common.save_final(out, state)
    accelerator.end_training()


if __name__ == "__main__":
    main()
