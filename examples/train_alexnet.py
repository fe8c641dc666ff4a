"""ImageNet-style training, shaped like pytorch/examples `imagenet/main.py` (AlexNet).

The NPU profile in the project's reference data comes from that example; this script
keeps its structure (argparse flags, criterion on the GPU, SGD with momentum and weight
decay, `--dummy` synthetic data) but defines AlexNet inline so torchvision is optional.
    python examples/train_alexnet.py --dummy -b 4 --image-size 224 --epochs 1
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class AlexNet(nn.Module):
    """torchvision.models.alexnet, same layers."""

    def __init__(self, num_classes=1000, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
            nn.Dropout(p=dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class FakeImageNet(Dataset):
    def __init__(self, n, size, classes):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.classes, (1,), generator=g))


def accuracy(output, target, topk=(1, 5)):
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0) * (100.0 / target.size(0)) for k in topk]


def main():
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (AlexNet)")
    parser.add_argument("-a", "--arch", default="alexnet")
    parser.add_argument("-j", "--workers", default=0, type=int)
    parser.add_argument("--epochs", default=1, type=int)
    parser.add_argument("-b", "--batch-size", default=8, type=int)
    parser.add_argument("--lr", "--learning-rate", default=0.01, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--gpu", default=0, type=int)
    parser.add_argument("--dummy", action="store_true", help="use fake data")
    parser.add_argument("--image-size", default=224, type=int)
    parser.add_argument("--samples", default=64, type=int)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = AlexNet()
    torch.cuda.set_device(args.gpu)
    model = model.cuda(args.gpu)
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    torch.backends.cudnn.benchmark = True
    dataset = FakeImageNet(args.samples, args.image_size, 1000)
    train_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                              pin_memory=True, drop_last=True)
    for epoch in range(args.epochs):
        model.train()
        end = time.time()
        for i, (images, target) in enumerate(train_loader):
            images = images.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"Epoch [{epoch}][{i}] loss {loss.item():.4f} acc@1 {acc1.item():.1f} time {time.time() - end:.3f}")
            end = time.time()


if __name__ == "__main__":
    main()
