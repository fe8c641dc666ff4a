"""Trains a small regressor and, every step, scores a few held-out batches under no_grad (the
evaluation forwards opscope records only the first few of); warns and logs on stderr itself.
Under torchrun it trains data-parallel (gloo)."""
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
if "WORLD_SIZE" in os.environ:   # started by torchrun
    dist.init_process_group("gloo")
    model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
held_out = [torch.randn(4, 8) for _ in range(8)]
warnings.warn("noisy_eval: learning rate schedule not set, using a constant 0.05", UserWarning)
for step in range(6):
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    model.eval()
    with torch.no_grad():
        score = sum(model(b).abs().mean().item() for b in held_out)
    model.train()
    print(f"noisy_eval: step {step} held-out score {score:.3f}", file=sys.stderr)
