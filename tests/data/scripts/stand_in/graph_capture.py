"""Training that turns to CUDA graphs after warm-up (as CUDA-graph recipes do): the first three steps run
eagerly, in NVTX ranges for Nsight, the fourth captures a graph, which needs a real GPU's runtime."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
static_x = torch.randn(4, 8, device="cuda")
for step in range(6):
    if step == 3:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = model(static_x).sum()
    torch.cuda.nvtx.range_push(f"step {step}")
    loss = model(static_x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.nvtx.range_pop()
