"""Its first training step never finishes: the forward runs, then the script waits on a stuck
data source before the backward (like a hung collective or a slow remote read)."""
import time

import torch
import torch.nn as nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    out = model(torch.randn(4, 3, 16, 16))
    loss = out.logsumexp(dim=1).mean()
    while True:  # waits forever for something that never comes
        time.sleep(0.1)
    loss.backward()
    opt.step()
