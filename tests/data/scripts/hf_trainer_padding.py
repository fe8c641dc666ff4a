"""Fine-tune a (tiny, randomly initialised) BERT classifier with Hugging Face's Trainer, as the
text-classification examples do: tokenize without padding, let DataCollatorWithPadding pad
each batch, accumulate gradients. Offline: the vocabulary is written locally, the model is
built from a config."""
import argparse
import os
import random
import tempfile

from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast, DataCollatorWithPadding,
                          Trainer, TrainingArguments)

WORDS = ["the", "a", "model", "runs", "fast", "slow", "on", "device", "npu", "gpu", "data", "is", "good", "bad"]


class TextDataset:
    def __init__(self, encodings, labels):
        self.encodings, self.labels = encodings, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {**{k: v[i] for k, v in self.encodings.items()}, "labels": self.labels[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--padding", default="longest", choices=["longest", "max_length"])
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--drop-last", action="store_true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="hf-trainer-")
    vocab = os.path.join(work, "vocab.txt")
    with open(vocab, "w") as fh:
        fh.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=vocab)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 28))) for _ in range(args.samples)]
    labels = [rng.randint(0, 1) for _ in texts]
    encodings = tokenizer(texts, truncation=True, max_length=32)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2)
    model = BertForSequenceClassification(config)
    collator = DataCollatorWithPadding(tokenizer, padding=args.padding, max_length=32)
    training_args = TrainingArguments(output_dir=os.path.join(work, "out"), per_device_train_batch_size=8,
                                      gradient_accumulation_steps=2, max_steps=args.max_steps, learning_rate=1e-3,
                                      report_to=[], save_strategy="no", logging_strategy="no",
                                      dataloader_drop_last=args.drop_last, seed=0)
    trainer = Trainer(model=model, args=training_args, train_dataset=TextDataset(encodings, labels),
                      data_collator=collator)
    trainer.train()


if __name__ == "__main__":
    main()
