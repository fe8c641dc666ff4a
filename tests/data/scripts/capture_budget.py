"""A training step whose tensors are large (about 1.3 GB of activations) and whose calls are few, or
(``--runaway N``) a step that also makes N tiny torch calls: on the CPU stand-in the first is the GPU's
memory, the second is what the capture itself holds."""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=8192)
parser.add_argument("--layers", type=int, default=20)
parser.add_argument("--runaway", type=int, default=0)
args = parser.parse_args()


class Block(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * x   # keeps two activations of x's size for the backward


device = "cuda"
model = nn.Sequential(nn.Linear(1024, 1024), *[Block() for _ in range(args.layers)]).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.batch, 1024, device=device)   # 32 MB at batch 8192
small = torch.ones(4, device=device)
for step in range(4):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    for _ in range(args.runaway):
        small = small.add(1.0)
    opt.step()
