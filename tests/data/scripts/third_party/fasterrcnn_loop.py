"""A torchvision detection training loop: Faster R-CNN (MobileNetV3-Large 320 FPN, no pretrained weights),
two 320 px images with their boxes per step, SGD with momentum, the losses summed as torchvision's
references do."""
import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

torch.manual_seed(0)
model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=5).cuda()
model.train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
for step in range(5):
    images = [torch.rand(3, 320, 320).cuda() for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 120.0, 160.0], [50.0, 60.0, 200.0, 220.0]]).cuda(),
                "labels": torch.tensor([1, 3]).cuda()} for _ in range(2)]
    loss_dict = model(images, targets)
    losses = sum(loss for loss in loss_dict.values())
    optimizer.zero_grad()
    losses.backward()
    optimizer.step()
