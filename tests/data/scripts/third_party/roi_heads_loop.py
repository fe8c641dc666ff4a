"""The box head of a two-stage detector, trained as detection code runs it: proposals scored, kept by
torchvision.ops.nms, pooled with roi_align (and roi_pool in a second branch), classified, backpropagated."""
import torch
import torch.nn as nn
from torchvision.ops import nms, roi_align, roi_pool

torch.manual_seed(0)
backbone = nn.Conv2d(3, 16, 3, padding=1).cuda()
head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 7 * 7 * 2, 5)).cuda()
opt = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.01, momentum=0.9)
for step in range(5):
    images = torch.randn(2, 3, 64, 64, device="cuda")
    features = backbone(images)
    xy = torch.rand(64, 2, device="cuda") * 40
    boxes = torch.cat([xy, xy + 8 + torch.rand(64, 2, device="cuda") * 16], dim=1)
    scores = torch.rand(64, device="cuda")
    keep = nms(boxes, scores, iou_threshold=0.5)[:16]
    kept = boxes[keep]
    rois = torch.cat([torch.zeros(len(kept), 1, device="cuda"), kept], dim=1)
    pooled = torch.cat([roi_align(features, rois, output_size=7, spatial_scale=1.0, sampling_ratio=2, aligned=True),
                        roi_pool(features, rois, output_size=7)], dim=1)
    loss = nn.functional.cross_entropy(head(pooled), torch.randint(0, 5, (len(kept),), device="cuda"))
    opt.zero_grad()
    loss.backward()
    opt.step()
