"""A small classifier that logs loss.item() every step, skips non-finite losses, masks low-confidence
samples out of the loss with boolean indexing, checkpoints every 100 steps and stops early when the loss
stops improving."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
best, patience, bad_steps = math.inf, 50, 0
for step in range(200):
    x = torch.randn(32, 20)
    y = torch.randint(0, 5, (32,))
    logits = model(x)
    confident = logits.softmax(-1).max(-1).values > 0.3
    kept = logits[confident]
    loss = F.cross_entropy(kept, y[confident]) if kept.numel() else F.cross_entropy(logits, y)
    if not torch.isfinite(loss):
        continue
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    value = loss.item()
    print(f"step {step} loss {value:.4f}")
    if step % 100 == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.pt")
    if value < best - 1e-4:
        best, bad_steps = value, 0
    else:
        bad_steps += 1
        if bad_steps > patience:
            print("early stop")
            break
