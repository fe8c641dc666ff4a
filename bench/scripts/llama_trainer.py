"""Pre-train a small Llama with the Hugging Face Trainer, as run_clm-style scripts do: TrainingArguments from the
command line, a causal-LM collator, the Trainer's default optimizer (torch's fused AdamW where torch has it).
Everything is built locally from a config (no download): random tokens, vocabulary 32,000.

    python bench/scripts/llama_trainer.py --hidden 512 --layers 6 --seq 512 --per_device_train_batch_size 8 \
        --max_steps 4 --output_dir /tmp/llama-out --report_to none
(issue 41's real-size Llama; on a machine without a GPU, scan it as `opscope scan` would on the GPU machine).
"""
import sys
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    hidden: int = field(default=512)
    layers: int = field(default=6)
    heads: int = field(default=8)
    seq: int = field(default=512)
    vocab: int = field(default=32000)
    samples: int = field(default=256)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv=None):
    model_args, args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses(argv)
    config = LlamaConfig(vocab_size=model_args.vocab, hidden_size=model_args.hidden,
                         intermediate_size=model_args.hidden * 11 // 4, num_hidden_layers=model_args.layers,
                         num_attention_heads=model_args.heads, num_key_value_heads=model_args.heads,
                         max_position_embeddings=model_args.seq)
    model = LlamaForCausalLM(config)
    trainer = Trainer(model=model, args=args,
                      train_dataset=RandomTokens(model_args.samples, model_args.seq, model_args.vocab))
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1:])
