"""A script on Phalanx's Run API (lint corpus: no finding expected)."""
import torch
import torch.nn as nn

import phalanx

run = phalanx.init(seed=0)
model, opt = run.setup(nn.Linear(4, 1), lambda p: torch.optim.AdamW(p, lr=1e-3))
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = run.loader(data, batch_size=8)
acc = run.accumulate(model, steps=2)
for x, y in loader:
    with acc.micro_step():
        acc.backward(nn.functional.mse_loss(model(x), y))
    if acc.boundary:
        opt.step()
        opt.zero_grad(set_to_none=True)
run.print("loss", run.all_reduce_mean(0.5))
run.close()
