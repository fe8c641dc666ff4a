"""A loop whose helper calls a private CUDA binding directly (torch._C._cuda_synchronize) in its third
step, as some profiling utilities do: it reaches the CUDA runtime from C++, past torch.cuda."""
import torch
import torch.nn as nn

model = nn.Linear(8, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 8, device="cuda")).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        torch._C._cuda_synchronize()
