"""A ResNet-style classifier trained the way Ascend's porting guides show mixed precision: NVIDIA apex amp
at O2 with a static loss scale of 128 (amp.initialize, amp.scale_loss) and apex's FusedAdam."""
import torch
import torch.nn as nn
from apex import amp
from apex.optimizers import FusedAdam


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv(x)))


model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), Block(16), Block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(16, 10)).cuda()
criterion = nn.CrossEntropyLoss().cuda()
optimizer = FusedAdam(model.parameters(), lr=1e-3)
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=128.0)
for step in range(5):
    images = torch.randn(8, 3, 32, 32).cuda(non_blocking=True)
    target = torch.randint(0, 10, (8,)).cuda(non_blocking=True)
    output = model(images)
    loss = criterion(output, target)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
