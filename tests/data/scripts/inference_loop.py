"""An inference loop without an optimizer: steps are top-level module calls."""
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
with torch.no_grad():
    for i in range(10):
        y = model(torch.randn(4, 8))
        print(y.argmax(dim=1).tolist())
