"""A GPU-style MLP trained under bf16 autocast, with a float64 cumsum in the loop (a running
statistic kept in double) and, with --uint64, a uint64 counter: what a 910A cannot take."""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=4)
parser.add_argument("--uint64", action="store_true", help="also keep a uint64 cumulative counter")
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
history = torch.zeros(8, dtype=torch.float64, device=device)
for it in range(args.iters):
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        out = model(x)
    loss = loss_fn(out.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    running = torch.cumsum(history + loss.detach().double(), dim=0)
    if args.uint64:
        seen = torch.cumsum(torch.ones(8, dtype=torch.uint64, device=device), dim=0)
    print(f"iter {it} loss {loss.item():.4f} running {running[-1].item():.3f}", flush=True)
