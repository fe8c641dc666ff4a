"""Self-training on confident pseudo-labels: the number of samples kept is read back with .item()."""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threshold", type=float, default=0.55)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 10))
    loader = DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for (x,) in loader:
        x = x.cuda()
        logits = model(x)
        conf, pseudo = logits.softmax(-1).max(-1)
        order = conf.argsort(descending=True)
        n_keep = int((conf > args.threshold).sum().item())
        keep = order[:max(n_keep, 2)]
        loss = nn.functional.cross_entropy(logits[keep], pseudo[keep].detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
