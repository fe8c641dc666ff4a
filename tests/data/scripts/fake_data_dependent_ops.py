"""Data-dependent operators in a training step: nonzero, masked_select, unique, .tolist(), int(tensor),
boolean-mask assignment, and a loop on a tensor condition."""
import torch
import torch.nn as nn

model = nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(5):
    x = torch.randn(16, 8)
    out = model(x)
    positive = torch.nonzero(out > 0)
    selected = torch.masked_select(out, out > 0)
    classes = torch.unique(out.argmax(-1))
    seen, inverse, counts = torch.unique(out.argmax(-1), return_inverse=True, return_counts=True)
    means = out.mean(0).tolist()
    total = int(out.sum())
    out = out.clone()
    out[out < 0] = 0
    loss = out.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    while (loss > 10).any():
        loss = loss / 2
    print(step, len(means), total, positive.shape, selected.shape, classes.shape, counts.shape)
