"""A training loop on the public API with plain SGD, shared by the worker and the tests.

AdamW normalises gradient scale away, so a trainer-level comparison alone could not
see an accumulation that forgets to divide by K, or ranks that sum instead of average.
Here the gradients themselves are recorded at every optimizer step and compared.
"""

from __future__ import annotations

import torch

from phalanx.data import TokenWindows
from phalanx.models import GPTConfig, MiniGPT

TINY = GPTConfig(block_size=32, n_layer=2, n_head=2, n_embd=32)


def sgd_trajectory(run, tokens, micro_batch: int, accum: int, steps: int) -> dict:
    """Train with SGD through run.setup/loader/accumulate; record grads and local grads."""
    torch.manual_seed(11)
    model, opt = run.setup(MiniGPT(TINY), lambda p: torch.optim.SGD(p, lr=0.5))
    batches = iter(run.loader(TokenWindows(tokens, TINY.block_size), micro_batch, seed=5,
                              stream=True))
    acc = run.accumulate(model, accum)
    grads, first_micro_grads = [], []
    for _ in range(steps):
        for k in range(accum):
            x, y = next(batches)
            with acc.micro_step():
                acc.backward(model(x, y)[1])
            if k == 0 and accum > 1:
                first_micro_grads.append(model.module.wte.weight.grad.clone()
                                         if hasattr(model, "module") else None)
        assert acc.boundary
        grads.append({n: p.grad.clone() for n, p in run.unwrap(model).named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    state = {k: v.clone() for k, v in run.unwrap(model).state_dict().items()}
    return {"grads": grads, "state": state, "first_micro_grads": first_micro_grads}
