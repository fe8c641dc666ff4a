"""A tiny training job; in its second step it SIGKILLs itself if KILL_FILE exists, or hangs if HANG_FILE does."""
import argparse
import os
import signal
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=8)
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(args.width, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 1 and os.environ.get("KILL_FILE") and os.path.exists(os.environ["KILL_FILE"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 1 and os.environ.get("HANG_FILE") and os.path.exists(os.environ["HANG_FILE"]):
        time.sleep(600)
    x, y = torch.randn(4, args.width), torch.randint(0, 2, (4,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
