"""A deformable-convolution block trained as detection backbones (DCNv2-style) train it: the offsets come
from a plain convolution, torchvision.ops.DeformConv2d samples with them."""
import argparse

import torch
from torch import nn
from torchvision.ops import DeformConv2d

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = nn.Conv2d(8, 2 * 3 * 3, 3, padding=1)
        self.deform = DeformConv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        y = self.deform(x, self.offset(x)).relu()
        return self.head(y.mean((2, 3)))


model = Block().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    x = torch.randn(2, 8, 12, 12).cuda()
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
