"""A per-operator benchmark as people write one: a module wrapping one op, called in a loop on the same
tensors (run with --step-marker module).  Each call re-reads the tensors the call before it read."""
import argparse

import torch
from torch import nn


class Residual(nn.Module):
    def forward(self, x, y):
        return torch.add(x, y)


parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=20)
parser.add_argument("--shape", type=int, nargs="+", default=[4, 512, 1024])
args = parser.parse_args()

x = torch.randn(*args.shape)
y = torch.randn(*args.shape)
op = Residual()
with torch.no_grad():
    for _ in range(args.iters):
        out = op(x, y)
print(f"done: {out.shape}")
