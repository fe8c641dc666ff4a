"""A Llama causal LM built from a config (no weights) with transformers, trained with a plain loop on
synthetic token batches of varying length padded to the longest."""
import argparse
import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--intermediate", type=int, default=128)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--vocab", type=int, default=256)
parser.add_argument("--seq", type=int, default=32)
parser.add_argument("--batch-size", type=int, default=2)
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
random.seed(0)
torch.manual_seed(0)
config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                     num_hidden_layers=args.layers, num_attention_heads=args.heads,
                     num_key_value_heads=args.heads, max_position_embeddings=args.seq, pad_token_id=0)
model = LlamaForCausalLM(config)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(args.steps):
    lengths = [random.randint(args.seq // 2, args.seq) for _ in range(args.batch_size)]
    longest = max(lengths)
    ids = torch.zeros(args.batch_size, longest, dtype=torch.long)
    mask = torch.zeros(args.batch_size, longest, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, args.vocab, (n,))
        mask[i, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {out.loss.item():.3f}")
