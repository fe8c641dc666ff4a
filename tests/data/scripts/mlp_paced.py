"""A 3-layer MLP trained on random batches, pausing between steps (a job that reads from a
slow source): long enough per step to kill it, fill its disk or race a second scan."""
import argparse
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=1000)
parser.add_argument("--pause", type=float, default=0.2, help="seconds to wait after each step")
args = parser.parse_args()

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
for it in range(args.iters):
    x = torch.randn(16, 32)
    y = torch.randint(0, 4, (16,))
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"iter {it} loss {loss.item():.4f}", flush=True)
    time.sleep(args.pause)
