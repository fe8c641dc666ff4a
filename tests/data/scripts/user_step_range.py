"""A training loop instrumented by its author: each iteration runs inside its own profiler range
(``torch.profiler.record_function``), and the loss is read back after the optimizer step, still
inside that range."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    with torch.profiler.record_function("train_step"):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        running = loss.detach().clone().mul_(0.5)
    print(step, float(running))
