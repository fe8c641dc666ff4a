"""A plain MLP regression loop with AdamW, as a real script would be written."""
import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=1024)
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(512, args.hidden), nn.GELU(), nn.Linear(args.hidden, args.hidden), nn.GELU(),
                      nn.LayerNorm(args.hidden), nn.Linear(args.hidden, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
for step in range(args.steps):
    x = torch.randn(args.batch, 512, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
print("done", float(loss))
