"""A small causal language model whose attention uses flash-attn when it can be imported and SDPA
otherwise, the guarded import that LLM training code uses; bf16 autocast, AdamW."""
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from flash_attn import flash_attn_func
    HAS_FLASH_ATTN = True
except ImportError:
    HAS_FLASH_ATTN = False
print("flash-attn path" if HAS_FLASH_ATTN else "SDPA fallback path", flush=True)


class Attention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        if HAS_FLASH_ATTN:
            y = flash_attn_func(q, k, v, dropout_p=0.0, causal=True)
        else:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        return self.out(y.reshape(b, t, d))


model = nn.Sequential(nn.Embedding(100, 64), Attention(), nn.LayerNorm(64), nn.Linear(64, 100)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(4):
    ids = torch.randint(0, 100, (2, 32), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, 100), ids.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
