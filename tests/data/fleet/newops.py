"""Uses operators torch_npu 2.1 runs on the CPU (scatter_reduce, bitwise_left_shift) and 2.14 supports."""
import torch

model = torch.nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
index = torch.tensor([0, 1, 0, 1, 2, 2])
for step in range(100):
    h = model(torch.randn(6, 8))
    pooled = torch.zeros(3, 4).scatter_reduce(0, index[:, None].expand(6, 4), h, reduce="amax", include_self=False)
    loss = pooled.mean() + torch.bitwise_left_shift(index, 1).sum() * 0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
