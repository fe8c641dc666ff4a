"""A training loop whose global optimizer post-hook does tensor work (an EMA of the weights),
registered by the script itself, as EMA and logging utilities do. The hook runs inside
``Optimizer.step``'s profiler range."""
import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_post_hook

model = nn.Linear(8, 4)
ema = [p.detach().clone() for p in model.parameters()]
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def update_ema(opt, args, kwargs):
    with torch.no_grad():
        for shadow, p in zip(ema, model.parameters()):
            shadow.lerp_(p, 0.01)


register_optimizer_step_post_hook(update_ema)

for step in range(6):
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
