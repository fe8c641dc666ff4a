"""Trains one step, then leaks memory without bound (a cache that is never cleared)."""
import time

import torch
import torch.nn as nn

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cache = []
for step in range(1, 100):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        while True:
            cache.append(bytearray(20 * 2**20))   # 20 MB more every 50 ms, touched so it is resident
            cache[-1][::4096] = b"x" * len(cache[-1][::4096])
            time.sleep(0.05)
