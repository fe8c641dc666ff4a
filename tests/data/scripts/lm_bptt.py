"""Word-level LSTM language model, as in pytorch/examples word_language_model.

The token stream is batchified into columns and cut into bptt-long chunks by
``get_batch``; the last chunk of an epoch is shorter (``seq_len`` is clipped to what
is left of the stream).  Weights are initialised with ``nn.init``; SGD with momentum.
"""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_corpus(n_tokens, vocab):
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(n_tokens)]
    return torch.tensor(ids, dtype=torch.long)


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.init_weights()
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=112)
    parser.add_argument("--vocab", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--bptt", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--clip", type=float, default=0.25)
    args = parser.parse_args()
    torch.manual_seed(1111)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_data = batchify(load_corpus(args.tokens, args.vocab), args.batch_size, device)
    model = RNNModel(args.vocab, 16, 16, 2).to(device)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            print(f"epoch {epoch} batch {batch} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
