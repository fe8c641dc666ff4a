"""A CUDA-style super-resolution training loop (ESPCN-like): torch.cuda.amp autocast and GradScaler,
torch.cuda.synchronize() to time each step and torch.cuda.max_memory_allocated() for the log."""
import argparse
import time

import torch
import torch.nn as nn


class ESPCN(nn.Module):
    def __init__(self, scale=2, channels=3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, 32, 5, padding=2), nn.Tanh(),
                                  nn.Conv2d(32, 16, 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(16, channels * scale ** 2, 3, padding=1))
        self.shuffle = nn.PixelShuffle(scale)

    def forward(self, x):
        return self.shuffle(self.body(x))


parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=6)
args = parser.parse_args()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = ESPCN().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.cuda.amp.GradScaler()
torch.backends.cudnn.benchmark = True
for it in range(args.iters):
    lr_img = torch.rand(4, 3, 24, 24).cuda(non_blocking=True)
    hr_img = torch.rand(4, 3, 48, 48).cuda(non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.amp.autocast():
        loss = nn.functional.l1_loss(model(lr_img), hr_img)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch.cuda.synchronize()
    print(f"iter {it} loss {loss.item():.4f} {1000 * (time.perf_counter() - start):.1f} ms "
          f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB")
