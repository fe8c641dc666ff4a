"""A script that builds its model and returns before any training iteration (e.g. a bad flag)."""
import argparse

import torch.nn as nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=0)
    args = parser.parse_args()
    model = nn.Linear(4, 2)
    if args.epochs == 0:
        print("nothing to do: --epochs 0")
        return
    print(model)


if __name__ == "__main__":
    main()
