"""Adam(fused=True) on CUDA tensors, as GPU recipes enable it: the fused kernel aten::_fused_adam_ must be
captured (and judged: it falls back to the CPU on older torch_npu)."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
for step in range(4):
    x = torch.randn(8, 16, device="cuda")
    y = torch.randn(8, 4, device="cuda")
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
