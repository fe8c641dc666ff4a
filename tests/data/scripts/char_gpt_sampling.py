"""A char-level GPT trained with a sampling callback that generates text inside the loop
(the way minGPT/char-rnn trainers report progress)."""
import argparse

import torch
import torch.nn as nn
from torch.nn import functional as F


class TinyGPT(nn.Module):
    def __init__(self, vocab, block, d=32, layers=2):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        layer = nn.TransformerEncoderLayer(d, 2, 4 * d, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.blocks(x, mask=mask, is_causal=True))


@torch.no_grad()
def sample(model, idx, steps, temperature=1.0):
    model.eval()
    for _ in range(steps):
        cond = idx[:, -model.block:]
        logits = model(cond)[:, -1, :] / temperature
        probs = F.softmax(logits, dim=-1)
        nxt = torch.multinomial(probs, num_samples=1)
        idx = torch.cat((idx, nxt), dim=1)
    model.train()
    return idx


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--sample-every", type=int, default=2)
    parser.add_argument("--sample-len", type=int, default=200)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    text = "hello opscope, the quick brown fox jumps over the lazy dog. " * 40
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    block = 32
    model = TinyGPT(len(chars), block).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for it in range(args.iters):
        ix = torch.randint(len(data) - block - 1, (8,))
        x = torch.stack([data[i:i + block] for i in ix]).to(args.device)
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix]).to(args.device)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if it % args.sample_every == 0:
            out = sample(model, x[:1, :4], args.sample_len)
            print(it, loss.item(), "".join(chars[i] for i in out[0].tolist())[:40])


if __name__ == "__main__":
    main()
