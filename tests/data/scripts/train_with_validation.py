"""A classifier trained on full batches (drop_last=True) and validated after every epoch on a
held-out set whose last batch is smaller: every validation sample counts in the metric."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(18, 10), torch.randint(0, 3, (18,)))
    val_set = TensorDataset(torch.randn(10, 10), torch.randint(0, 3, (10,)))
    train_loader = DataLoader(train_set, batch_size=4, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=4)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                correct += (model(x).argmax(1) == y).sum().item()
        print(f"epoch {epoch} val accuracy {correct / len(val_set):.2f}")


if __name__ == "__main__":
    main()
