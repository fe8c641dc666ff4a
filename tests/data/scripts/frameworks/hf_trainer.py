"""Fine-tune a sequence classifier with the Hugging Face Trainer, as run_glue-style scripts do:
TrainingArguments from the command line (--fp16 / --bf16, gradient accumulation), a tokenizer
and DataCollatorWithPadding (pad to the longest sequence of each batch).  Everything is built
locally from config objects: a tiny BERT, a word-level tokenizer over a made-up vocabulary."""
import os
import random
import tempfile

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (BertConfig, BertForSequenceClassification, DataCollatorWithPadding, HfArgumentParser,
                          PreTrainedTokenizerFast, Trainer, TrainingArguments)

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "big", "small", "red", "blue"]


def build_tokenizer():
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


class SentimentData:
    """Sentences of 4 to 24 words, labelled by whether "dog" occurs."""

    def __init__(self, tokenizer, n=64, seed=0):
        rng = random.Random(seed)
        self.rows = []
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
            enc = tokenizer(" ".join(words), truncation=True, max_length=32)
            self.rows.append({**enc, "labels": int("dog" in words)})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def main():
    parser = HfArgumentParser(TrainingArguments)
    args, = parser.parse_args_into_dataclasses(args=None, look_for_args_file=False)
    tokenizer = build_tokenizer()
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2,
                        pad_token_id=tokenizer.pad_token_id)
    model = BertForSequenceClassification(config)
    trainer = Trainer(model=model, args=args, train_dataset=SentimentData(tokenizer),
                      data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer)
    trainer.train()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
