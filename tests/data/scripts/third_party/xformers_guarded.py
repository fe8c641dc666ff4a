"""A decoder block whose attention uses xformers when it is installed, as many GPU training codebases do
(timm, DINOv2, Stable Diffusion forks): `try: import xformers.ops` / `except ImportError:` SDPA."""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

try:
    import xformers.ops as xops
    HAS_XFORMERS = True
except ImportError:
    HAS_XFORMERS = False

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).unbind(2)   # b x n x heads x dim
        if HAS_XFORMERS:
            out = xops.memory_efficient_attention(q, k, v, attn_bias=xops.LowerTriangularMask())
        else:
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True).transpose(1, 2)
        return self.proj(out.reshape(b, n, d))


torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(100, 64), Attention(), nn.Linear(64, 100)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    tokens = torch.randint(0, 100, (2, 16)).cuda()
    logits = model(tokens)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 100), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f} xformers={HAS_XFORMERS}")
