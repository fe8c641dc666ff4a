"""A training loop that profiles itself, as the PyTorch profiler recipe shows: CPU and CUDA activities,
a wait/warmup/active schedule, a TensorBoard trace handler, and the top operators printed at the end."""
import argparse
import tempfile

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=6)
args = parser.parse_args()
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
logdir = tempfile.mkdtemp()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=tensorboard_trace_handler(logdir), record_shapes=True) as prof:
    for it in range(args.iters):
        x, y = torch.randn(16, 32, device="cuda"), torch.randn(16, 4, device="cuda")
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5))
