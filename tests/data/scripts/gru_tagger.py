"""A GRU sequence tagger trained with Adam on a TensorDataset.

70 samples in batches of 16: the fifth (last) batch of each epoch holds 6 samples
(drop_last is not set).  Padding positions are left out of the loss with a boolean
mask, so the number of tokens in the loss depends on the data.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

PAD = 0


def make_dataset(n, seq_len, vocab, tags):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, vocab, (n, seq_len), generator=g)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (n,), generator=g)
    positions = torch.arange(seq_len).expand(n, seq_len)
    tokens[positions >= lengths[:, None]] = PAD
    labels = torch.randint(0, tags, (n, seq_len), generator=g)
    return TensorDataset(tokens, labels)


class Tagger(nn.Module):
    def __init__(self, vocab, dim, tags):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, tags)

    def forward(self, tokens):
        h, _ = self.gru(self.emb(tokens))
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=70)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    dataset = make_dataset(args.samples, args.seq_len, 30, 5)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    model = Tagger(30, 16, 5).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        for tokens, labels in loader:
            tokens, labels = tokens.cuda(), labels.cuda()
            logits = model(tokens)
            mask = tokens != PAD
            loss = criterion(logits[mask], labels[mask])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
