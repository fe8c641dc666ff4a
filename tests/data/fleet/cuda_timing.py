"""Times its steps with torch.cuda.Event and annotates with `torch.cuda.Stream | None` (as transformers 5 does)."""
import torch


def side_stream() -> torch.cuda.Stream | None:
    return torch.cuda.Stream() if torch.cuda.is_available() else None


device = "cuda"
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
stream = side_stream()
for step in range(100):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = model(torch.randn(3, 4, device=device)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    end.record()
    torch.cuda.synchronize()
    assert isinstance(start, torch.cuda.Event) and start.elapsed_time(end) >= 0
