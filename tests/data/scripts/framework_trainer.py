"""Fine-tune a text classifier with a framework's Trainer, as a Hugging Face user writes it:
tokenized samples of varying length, a padding data collator, gradient accumulation, and
everything run by `trainer.train()` (the framework here is a small stand-in installed in
vendor/site-packages, so the model, collator and loop are library code)."""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor", "site-packages"))

import torch  # noqa: E402

from minitrain import DataCollatorWithPadding, TinyTextClassifier, Trainer, TrainingArguments  # noqa: E402


def tokenized_dataset(n, vocab, rng):
    return [{"input_ids": [rng.randrange(1, vocab) for _ in range(rng.randint(5, 24))], "label": rng.randint(0, 1)}
            for _ in range(n)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--padding", default="longest", choices=["longest", "max_length"])
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--closure-step", action="store_true")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = tokenized_dataset(args.samples, 100, random.Random(0))
    collator = DataCollatorWithPadding(pad_token_id=0, padding=args.padding, max_length=24)
    training_args = TrainingArguments(per_device_train_batch_size=args.batch_size,
                                      gradient_accumulation_steps=args.grad_accum,
                                      dataloader_drop_last=args.drop_last, num_train_epochs=args.epochs,
                                      closure_step=args.closure_step, fp16=args.fp16)
    trainer = Trainer(model=TinyTextClassifier(), args=training_args, train_dataset=train, data_collator=collator)
    trainer.train()


if __name__ == "__main__":
    main()
