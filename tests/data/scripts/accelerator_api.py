"""A script using the torch>=2.6 device-generic idiom: torch.accelerator picks the device."""
import torch
import torch.nn as nn


def main():
    if torch.accelerator.is_available():
        device = torch.accelerator.current_accelerator()
        ngpus = torch.accelerator.device_count()
    else:
        raise SystemExit("this script needs an accelerator")
    print(f"training on {device} x{ngpus}")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    if ngpus > 1:
        model = nn.DataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(8):
        x = torch.randn(4, 8, device=device)
        y = torch.randint(0, 2, (4,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.accelerator.synchronize()


if __name__ == "__main__":
    main()
