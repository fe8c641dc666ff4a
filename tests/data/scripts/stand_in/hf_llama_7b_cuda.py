"""Llama-2-7B, built from its config with transformers (no weights), trained the GPU way: the model moved
with .cuda(), bf16 autocast on CUDA, AdamW, torch.cuda.synchronize() and the peak memory in the log.
Defaults are the 7B shape: scan it with --mode fake (a real run needs ~100 GB)."""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=32)
parser.add_argument("--hidden", type=int, default=4096)
parser.add_argument("--intermediate", type=int, default=11008)
parser.add_argument("--heads", type=int, default=32)
parser.add_argument("--vocab", type=int, default=32000)
parser.add_argument("--seq", type=int, default=512)
parser.add_argument("--batch-size", type=int, default=1)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()
torch.manual_seed(0)
config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                     num_hidden_layers=args.layers, num_attention_heads=args.heads,
                     num_key_value_heads=args.heads, max_position_embeddings=4096)
model = LlamaForCausalLM(config).cuda()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
for step in range(args.steps):
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"step {step} loss {loss.item():.3f} peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
