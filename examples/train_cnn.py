"""A small image-classification training script, written the way GPU scripts usually are.

It uses `.cuda()`, cudnn.benchmark, CUDA AMP (autocast + GradScaler),
torch.cuda.synchronize() and a DataLoader with pin_memory=True.  Data is synthetic
(no download), so it runs anywhere:  python examples/train_cnn.py --epochs 1
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def main():
    parser = argparse.ArgumentParser(description="CNN training on synthetic CIFAR-like data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--amp", action="store_true", default=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    images = torch.randn(args.samples, 3, 32, 32)
    labels = torch.randint(0, 10, (args.samples,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
                        num_workers=0, pin_memory=True, drop_last=True)

    model = Net().cuda()
    criterion = nn.CrossEntropyLoss().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)

    for epoch in range(args.epochs):
        model.train()
        start = time.time()
        for i, (x, y) in enumerate(loader):
            x = x.cuda(non_blocking=True)
            y = y.cuda(non_blocking=True)
            optimizer.zero_grad()
            with torch.cuda.amp.autocast(enabled=args.amp):
                out = model(x)
                loss = criterion(out, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if i % 10 == 0:
                torch.cuda.synchronize()
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
        torch.cuda.synchronize()
        print(f"epoch {epoch} took {time.time() - start:.2f}s")


if __name__ == "__main__":
    main()
