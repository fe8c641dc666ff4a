"""Kills the process that runs its `opscope scan` (a Ray worker) in the second step, then hangs."""
import os
import signal
import time

import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 1:
        scan_pid = os.getppid()
        with open(f"/proc/{scan_pid}/stat") as fh:
            worker_pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        os.kill(worker_pid, signal.SIGKILL)
        time.sleep(600)
    loss = model(torch.randn(3, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
