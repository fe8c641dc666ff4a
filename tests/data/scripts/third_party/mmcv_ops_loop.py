"""A detection-style training loop that uses mmcv's compiled ops, as mmdet/mmaction code does: a sigmoid focal
loss (forward and backward in mmcv's _ext), NMS on the predicted boxes, and TIN's temporal shift."""
import argparse

import torch
from mmcv.ops import nms, sigmoid_focal_loss, tin_shift
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
backbone = nn.Conv2d(8, 16, 3, padding=1).cuda()
cls_head = nn.Linear(16, 5).cuda()
box_head = nn.Linear(16, 4).cuda()
opt = torch.optim.SGD([*backbone.parameters(), *cls_head.parameters(), *box_head.parameters()], lr=0.01)
shift = torch.tensor([[1, -1]], dtype=torch.int32).repeat(2, 1).cuda()

for step in range(args.steps):
    clips = torch.randn(2, 4, 8, 6, 6).cuda()                            # batch, time, channels, h, w
    feats = backbone(clips.flatten(0, 1)).view(2, 4, 16, 36)             # (n, t, c, h*w)
    feats = tin_shift(feats, shift).mean(-1).flatten(0, 1)               # 8 x 16
    logits = cls_head(feats)
    targets = torch.randint(0, 5, (8,)).cuda()
    loss = sigmoid_focal_loss(logits, targets, 2.0, 0.25)
    boxes = box_head(feats).sigmoid() * 32
    boxes = torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:] + 1], dim=1)
    with torch.no_grad():
        kept, _ = nms(boxes, logits.max(1).values, 0.5)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f} kept {kept.shape[0]}")
