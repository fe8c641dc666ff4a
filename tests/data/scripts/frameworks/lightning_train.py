"""PyTorch Lightning, as its docs write it: a LightningModule and Trainer(accelerator="gpu", devices=1,
precision="16-mixed").  A small convolutional classifier on synthetic 16x16 images."""
import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(L.LightningModule):
    def __init__(self, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(8 * 16, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="16-mixed")
    parser.add_argument("--max_steps", type=int, default=20)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 3, 16, 16, generator=g), torch.randint(0, 10, (128,), generator=g))
    trainer = L.Trainer(accelerator="gpu", devices=1, precision=args.precision, max_steps=args.max_steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LitClassifier(), DataLoader(data, batch_size=16, shuffle=True))


if __name__ == "__main__":
    main()
