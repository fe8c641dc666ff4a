"""A float32 CNN step on the CPU: convolution runs through oneDNN (mkldnn_convolution)."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(10):
    x = torch.randn(4, 3, 32, 32)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 4, (4,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
