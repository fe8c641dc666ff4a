"""A Llama-2 causal-LM training loop in plain PyTorch (RMSNorm, rotary embeddings, SwiGLU MLP, grouped
attention with SDPA), as a porting engineer would write it: synthetic token batches of varying length
padded to the longest, bf16 autocast, AdamW.  Defaults are the Llama-2-7B configuration."""
import argparse
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, hidden):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.head_dim = dim // heads

    def forward(self, ids, attention_mask):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device=ids.device).float() / self.head_dim))
        freqs = torch.outer(pos.float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        mask = causal[None, None] & attention_mask[:, None, None, :].bool()
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


def batches(batch_size, max_len, vocab, pad_id=0):
    """Token sequences of varying length, padded to the longest in the batch."""
    while True:
        lengths = [random.randint(max_len // 2, max_len) for _ in range(batch_size)]
        longest = max(lengths)
        ids = torch.full((batch_size, longest), pad_id, dtype=torch.long)
        mask = torch.zeros(batch_size, longest, dtype=torch.long)
        for i, n in enumerate(lengths):
            ids[i, :n] = torch.randint(1, vocab, (n,))
            mask[i, :n] = 1
        yield ids, mask


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--hidden", type=int, default=11008)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    random.seed(0)
    torch.manual_seed(0)
    model = Llama(args.vocab, args.dim, args.layers, args.heads, args.hidden).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = batches(args.batch_size, args.seq, args.vocab)
    for step in range(args.steps):
        ids, mask = next(data)
        ids, mask = ids.to(args.device), mask.to(args.device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(ids, mask)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1),
                                   ignore_index=0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
