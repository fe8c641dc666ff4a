"""Trains normally, then fails in the middle of step 3 (like a shape bug on a rare batch)."""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at", type=int, default=3)
    args = parser.parse_args()
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 100):
        x = torch.randn(4, 8)
        out = model(x)
        if step == args.fail_at:
            raise RuntimeError(f"bad batch at step {step}")
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
