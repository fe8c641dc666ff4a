"""The smallest GPU training loop there is: a model moved with .cuda(), AdamW, three steps.
On a CUDA build of torch without a GPU, AdamW's graph-capture check used to reach the CUDA driver."""
import torch
import torch.nn as nn

model = nn.Linear(8, 2).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(4, 8).cuda()
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
