"""A GPU training script as people write them; every CUDA API below must be reported."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this script needs a GPU"
    torch.cuda.set_device(0)
    torch.backends.cudnn.benchmark = True
    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, pin_memory=True, drop_last=True)
    device = torch.device("cuda:0")
    model = build_model().cuda()
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(args.epochs):
        for x, y in loader:
            x = x.cuda(non_blocking=True)
            y = y.to(device)
            with torch.cuda.amp.autocast():
                loss = criterion(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            torch.cuda.synchronize()
            mem = torch.cuda.max_memory_allocated()
            print(f"loss {loss.item():.3f} mem {mem}")


if __name__ == "__main__":
    main()
