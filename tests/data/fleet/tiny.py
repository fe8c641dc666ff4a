"""A tiny training job; with KILL_FILE set and present it SIGKILLs itself in its second step."""
import argparse
import os
import signal

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--width", type=int, default=8)
args = parser.parse_args()
model = torch.nn.Sequential(torch.nn.Linear(args.width, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 1 and os.environ.get("KILL_FILE") and os.path.exists(os.environ["KILL_FILE"]):
        os.kill(os.getpid(), signal.SIGKILL)
    x, y = torch.randn(4, args.width), torch.randint(0, 2, (4,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
