"""A one-block attention trainer in the shape of nanoGPT's train.py: F.scaled_dot_product_attention with
dropout (the CPU's math path), AdamW in two weight-decay groups, gradient clipping, and an estimate_loss()
of --eval-iters no-grad forwards per split at iteration 0 (tests/test_fake_estimate.py)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--seq", type=int, default=512)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--eval-iters", type=int, default=0)
parser.add_argument("--iters", type=int, default=4)
args = parser.parse_args()
B, T, H, C, V = args.batch, args.seq, args.heads, args.dim, 97


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)
        return x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.block = Block()
        self.head = nn.Linear(C, V, bias=False)

    def forward(self, idx, targets):
        logits = self.head(self.block(self.wte(idx)))
        return logits, F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = Tiny()
decay = [p for p in model.parameters() if p.dim() >= 2]
nodecay = [p for p in model.parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                              lr=1e-3)


def get_batch():
    x = torch.randint(0, V, (B, T))
    return x, torch.roll(x, -1, 1)


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch()
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


for it in range(args.iters):
    if it == 0 and args.eval_iters:
        print("eval", estimate_loss())
    X, Y = get_batch()
    _, loss = model(X, Y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
