"""A single-process training script (lint corpus: no finding at all expected)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
loader = DataLoader(ds, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, loss.item())
torch.save(model.state_dict(), "model.pt")
state = torch.load("model.pt", map_location="cpu", weights_only=True)
