"""ImageNet-style ResNet-50 training, shaped like pytorch/examples `imagenet/main.py -a resnet50`.

Keeps that script's structure — argparse flags, `.cuda(args.gpu)`, SGD with momentum and weight
decay, a StepLR scheduler stepped once per epoch, `--dummy` synthetic data — with ResNet-50
defined inline (torchvision's layers) so torchvision is optional.
    python examples/train_resnet50.py --dummy -b 8 --image-size 64 --epochs 1
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """torchvision.models.resnet50, same layers."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, stride=2)
        self.layer3 = self._make_layer(256, 6, stride=2)
        self.layer4 = self._make_layer(512, 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class FakeImageNet(Dataset):
    def __init__(self, n, size, classes):
        self.n, self.size, self.classes = n, size, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), int(torch.randint(self.classes, (1,), generator=g))


def main():
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (ResNet-50)")
    parser.add_argument("-a", "--arch", default="resnet50",
                        help="resnet50 is built in; any other torchvision.models name needs torchvision")
    parser.add_argument("-j", "--workers", default=0, type=int)
    parser.add_argument("--epochs", default=1, type=int)
    parser.add_argument("-b", "--batch-size", default=8, type=int)
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("--gpu", default=0, type=int)
    parser.add_argument("--dummy", action="store_true", help="use fake data")
    parser.add_argument("--image-size", default=224, type=int)
    parser.add_argument("--samples", default=64, type=int)
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.arch == "resnet50":
        model = ResNet50()
    else:   # as imagenet/main.py does: models.__dict__[args.arch]()
        try:
            import torchvision.models as models
        except Exception as exc:   # not installed, or built for another torch
            raise SystemExit(f"-a {args.arch} needs a working torchvision ({exc}); resnet50 is built in") from None
        if not callable(models.__dict__.get(args.arch)):
            raise SystemExit(f"-a {args.arch}: no such torchvision model")
        model = models.__dict__[args.arch]()
    torch.cuda.set_device(args.gpu)
    model = model.cuda(args.gpu)
    criterion = nn.CrossEntropyLoss().cuda(args.gpu)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=30, gamma=0.1)
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
            if isinstance(output, tuple):   # inception_v3 / googlenet in training: (logits, aux logits)
                output = output[0]
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 10 == 0:
                print(f"Epoch [{epoch}][{i}] loss {loss.item():.4f} time {time.time() - end:.3f}")
            end = time.time()
        scheduler.step()


if __name__ == "__main__":
    main()
