"""A sequence tagger trained on variable-length sentences, batched the usual PyTorch way: a
collate function pads each batch with pad_sequence to its longest sentence."""
import argparse

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader


def collate(batch):
    tokens = pad_sequence([t for t, _ in batch], batch_first=True, padding_value=0)
    tags = pad_sequence([y for _, y in batch], batch_first=True, padding_value=-100)
    return tokens, tags


class Tagger(nn.Module):
    def __init__(self, vocab=50, dim=16, tags=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=0)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, tags)

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        return self.out(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=64)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 20, (args.samples,), generator=g).tolist()
    data = [(torch.randint(1, 50, (n,), generator=g), torch.randint(0, 5, (n,), generator=g)) for n in lengths]
    loader = DataLoader(data, batch_size=8, shuffle=True, collate_fn=collate, drop_last=True, generator=g)
    model = Tagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss(ignore_index=-100)
    for tokens, tags in loader:
        loss = criterion(model(tokens).flatten(0, 1), tags.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
