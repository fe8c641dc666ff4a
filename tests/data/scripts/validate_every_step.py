"""Trains on full batches and scores one held-out batch after every step, cycling through a small
validation set whose last batch is smaller (an early-stopping monitor)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
train_loader = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 3, (64,))), batch_size=4,
                          shuffle=True, drop_last=True)
val_loader = DataLoader(TensorDataset(torch.randn(10, 10), torch.randint(0, 3, (10,))), batch_size=4)
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
val_batches = iter(val_loader)
for x, y in train_loader:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    try:
        vx, vy = next(val_batches)
    except StopIteration:
        val_batches = iter(val_loader)
        vx, vy = next(val_batches)
    model.eval()
    with torch.no_grad():
        accuracy = (model(vx).argmax(1) == vy).float().mean()
    model.train()
