"""Lightning Fabric, written to be launched with `lightning run model --accelerator cuda --precision 16-mixed
fabric_train.py` (or `fabric run`): Fabric() takes accelerator, devices and precision from the launcher,
which also starts the processes (so no fabric.launch()).  A small regression MLP on synthetic data."""
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    fabric = L.Fabric()
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16))
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
        fabric.print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
