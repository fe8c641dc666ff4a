"""A loop whose torch.repeat_interleave(x, repeats_tensor) runs on the host CPU on older torch_npu releases."""
import torch
from torch import nn

model = nn.Linear(64, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(4):
    x = torch.randn(32, 64)
    r = torch.tensor([2, 1, 1, 0] * 8)
    x = torch.repeat_interleave(x, r, dim=0)
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
