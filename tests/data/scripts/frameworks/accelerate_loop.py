"""A training loop written for Hugging Face accelerate (the shape of accelerate's nlp_example.py):
Accelerator() takes its mixed precision from `accelerate launch --mixed_precision` (or
--mixed_precision here), prepare() places model, optimizer and loader, accelerator.backward()
scales the loss.  A small MLP classifier on synthetic features."""
import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def get_dataloader(batch_size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    y = (x[:, 0] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, pin_memory=True, drop_last=True)


def training_function(args):
    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=args.cpu)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = get_dataloader(args.batch_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for epoch in range(args.num_epochs):
        for x, y in loader:
            outputs = model(x)
            loss = nn.functional.cross_entropy(outputs, y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser(description="accelerate training loop")
    parser.add_argument("--mixed_precision", type=str, default=None, choices=["no", "fp16", "bf16", "fp8"])
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_epochs", type=int, default=2)
    training_function(parser.parse_args())


if __name__ == "__main__":
    main()
