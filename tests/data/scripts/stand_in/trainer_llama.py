"""Hugging Face Trainer on a tiny Llama built from its config (no weights, no download), as causal-LM
fine-tuning scripts are written: TrainingArguments from the command line (--fp16 / --bf16 as the user
passes them), a dataset of token blocks, the default collator."""
import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class TokenBlocks(torch.utils.data.Dataset):
    def __init__(self, n=64, length=32, vocab=128):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def main():
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    Trainer(model=model, args=args, train_dataset=TokenBlocks()).train()


if __name__ == "__main__":
    main()
