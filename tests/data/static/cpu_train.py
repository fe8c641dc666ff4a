"""Plain CPU training code: the static scan must report nothing here."""
import argparse
import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pass
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    state = torch.load("ckpt.pt", map_location="cpu") if False else None
    print(json.dumps({"loss": float(loss), "state": state is None}))


if __name__ == "__main__":
    main()
