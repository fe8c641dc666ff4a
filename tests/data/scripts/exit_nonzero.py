"""Calls sys.exit(2) after one step (e.g. an early-stopping check gone wrong)."""
import sys

import torch
import torch.nn as nn

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 100):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 1:
        sys.exit(2)
