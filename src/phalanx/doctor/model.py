"""Model checks in a live group: identical replicas, identical gradients after a backward
on different data per rank, parameters without gradient, BatchNorm, DataParallel, and
the device of every parameter, buffer and input.

`--model package.module:factory`: `factory()` returns a module, or `(module, example)`
where `example` is one input batch (a tensor or a tuple of tensors). Without it, the
built-in MiniGPT (tiny preset) on random tokens.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from phalanx.doctor.checks import Check
from phalanx.errors import DistributedError
from phalanx.models.user import make_with_keywords
from phalanx.strategies.guards import check_same, diagnose_devices
from phalanx.strategies.tensors import is_shard


def _rank_batch(example, rank: int, device: torch.device):
    """The example with different values per rank (same shapes/dtypes), on `device`."""
    gen = torch.Generator().manual_seed(1234 + rank)
    if isinstance(example, (tuple, list)):
        return type(example)(_rank_batch(e, rank, device) for e in example)
    if not isinstance(example, torch.Tensor):
        return example
    if example.is_floating_point():
        return (example.cpu() + torch.randn(example.shape, generator=gen)).to(device)
    high = int(example.max().item()) + 1 if example.numel() else 2
    return torch.randint(0, max(high, 2), example.shape, generator=gen).to(device)


def _loss(output) -> torch.Tensor | None:
    """A scalar to run backward on: the mean of the output, or the sum of the means of
    its floating-point tensors (a tuple, list or dict); None when it holds none."""
    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, dict):
        output = list(output.values())
    parts = [o.float().mean() for o in output
             if isinstance(o, torch.Tensor) and o.is_floating_point()]
    return sum(parts[1:], parts[0]) if parts else None


def structure_checks(model: nn.Module, on_cuda: bool) -> list[Check]:
    dp = [n or "(root)" for n, m in model.named_modules() if isinstance(m, nn.DataParallel)]
    bn = [n for n, m in model.named_modules()
          if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)]
    checks = [Check("model", "no DataParallel", "fail" if dp else "pass",
                    f"nn.DataParallel at {', '.join(dp)}" if dp else "none",
                    "use DistributedDataParallel (one process per GPU)" if dp else "")]
    if bn and on_cuda:
        checks.append(Check("model", "BatchNorm", "warn", f"plain BatchNorm: {', '.join(bn[:5])}",
                            "nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP "
                            "(`--sync-batchnorm`)"))
    elif bn:
        checks.append(Check("model", "BatchNorm", "warn",
                            f"plain BatchNorm: {', '.join(bn[:5])}; on CPU SyncBatchNorm cannot "
                            f"run (torch implements it for CUDA only), so each rank normalises "
                            f"over its own batch", "on GPUs, convert to SyncBatchNorm"))
    else:
        checks.append(Check("model", "BatchNorm", "pass", "no BatchNorm layers"))
    return checks


# what a factory written for `phalanx train --model` is given when it asks (byte tokens, a
# short window), and the token ids it is fed when it returns no example
VOCAB, BLOCK, BATCH = 256, 64, 2


def model_checks(run, spec: str | None) -> list[Check]:
    model, example, keywords = make_with_keywords(spec, vocab_size=VOCAB, block_size=BLOCK)
    if example is None and spec is not None and "vocab_size" in keywords:
        example = torch.randint(0, VOCAB, (BATCH, BLOCK))  # a `train --model` factory
    checks = structure_checks(model, run.device.type == "cuda")
    wrapped = run.setup(model)
    checks.append(_consistent(run, wrapped))
    batch = _rank_batch(example, run.rank, run.device) if example is not None else None
    misplaced = diagnose_devices(model, run.device, batch)
    checks.append(Check("model", f"devices (expected {run.device})",
                        "fail" if misplaced else "pass",
                        "; ".join(misplaced[:5]) or "every parameter, buffer and input",
                        "model.to(device) before DDP; batch.to(device)" if misplaced else ""))
    if batch is None or misplaced:
        return checks
    args = batch if isinstance(batch, (tuple, list)) else (batch,)
    loss = _loss(wrapped(*args))
    if loss is None:  # e.g. a model returning token ids: nothing to differentiate
        checks.append(Check("model", "gradients after backward", "warn",
                            "the output holds no floating-point tensor: backward not run",
                            "return the logits or the loss from forward"))
        return checks
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    checks.append(Check("model", "every parameter gets a gradient", "fail" if unused else "pass",
                        f"no gradient: {', '.join(unused[:5])}" if unused else
                        f"{sum(1 for _ in model.parameters())} parameters",
                        "use them in forward, or DDP(find_unused_parameters=True)" if unused
                        else ""))
    grads = [(n, p.grad) for n, p in model.named_parameters()
             if p.grad is not None and not is_shard(p.grad)]  # shards differ
    if grads:
        checks.append(_same(run, grads, "gradients identical after backward (different "
                                        "data per rank)"))
    else:
        checks.append(Check("model", "gradients after backward", "pass",
                            f"sharded ({run.strategy.name}): each rank holds its own "
                            f"reduce-scattered shard, nothing to compare"))
    return checks


def _consistent(run, wrapped) -> Check:
    """The strategy's own consistency check (replicas: identical; sharded: each rank's
    shard where its placement says, unsharded tensors identical)."""
    name = "parameters and buffers consistent across ranks"
    try:
        run.check_consistency(wrapped)
    except DistributedError as exc:
        return Check("model", name, "fail", str(exc).split("] ", 1)[-1][:300],
                     "see the evidence: which tensor, which ranks")
    what = "sharded layout + unsharded tensors" if run.strategy.sharded else "bitwise"
    return Check("model", name, "pass", f"{run.strategy.name}: {what}, across "
                                        f"{run.world_size} ranks")


def _same(run, state, name: str) -> Check:
    try:
        check_same(state, run.device, run.world_size, name.split(" ")[0])
    except DistributedError as exc:
        return Check("model", name, "fail", str(exc).split("] ", 1)[-1][:300],
                     "see the evidence: which tensor, which ranks")
    return Check("model", name, "pass", f"{len(state)} tensors, bitwise, across "
                                        f"{run.world_size} ranks")
