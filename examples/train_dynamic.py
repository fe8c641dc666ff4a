"""A sequence-tagging training loop full of dynamic shapes (the NPU's worst case).

- the dataset size is not a multiple of the batch size and drop_last is False
  (the last batch is smaller);
- each batch has its own sequence length (padded per batch, not to a fixed length);
- boolean-mask indexing, torch.nonzero and masked_select pick a data-dependent
  number of elements every step.
"""
import argparse
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class VarLenDataset(Dataset):
    def __init__(self, n, vocab, max_len):
        g = random.Random(0)
        self.items = [torch.randint(1, vocab, (g.randint(4, max_len),)) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    length = max(len(x) for x in batch)
    out = torch.zeros(len(batch), length, dtype=torch.long)
    for i, x in enumerate(batch):
        out[i, : len(x)] = x
    return out


class Tagger(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens):
        h = torch.tanh(self.proj(self.emb(tokens)))
        return self.head(h).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=70)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(VarLenDataset(args.samples, 100, 24), batch_size=args.batch_size, collate_fn=collate)
    model = Tagger(100, 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for tokens in loader:
            scores = model(tokens)
            mask = tokens > 50
            selected = scores[mask]
            idx = torch.nonzero(tokens == 7)
            picked = torch.masked_select(scores, tokens < 10)
            loss = selected.pow(2).mean() + picked.abs().sum() * 0.01 + idx.float().mean() * 0.0
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"loss {loss.item():.4f} selected={selected.numel()} nonzero={idx.shape[0]}")


if __name__ == "__main__":
    main()
