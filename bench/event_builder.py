"""Time the live event -> OpCall conversion: today's builder against an earlier commit's.

``calls_from_kineto`` runs once per captured step (issue 24: scan overhead), so the one
builder that also serves trace files must not make it slower.  This records a few steps of
a small ResNet-style net (conv, batch norm, residual adds, SGD) under the profiler the way
a scan does (``record_shapes=True``, Kineto), then converts the same events with both
versions and prints the best of many alternating rounds of each and the ratio new / old:

    python bench/event_builder.py [--baseline 4ab9d01] [--steps 3] [--repeat 30]

The baseline's ``opscope/capture/events.py`` is read with ``git show`` (run it in a checkout).
Both versions get the same events; their OpCalls are compared too (count and names).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "4ab9d01"   # the last commit with the capture-only builder


def _old_module(ref: str) -> types.ModuleType:
    text = subprocess.run(["git", "show", f"{ref}:opscope/capture/events.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    module = types.ModuleType("old_events")
    exec(compile(text, f"{ref}:opscope/capture/events.py", "exec"), module.__dict__)
    return module


def _net():
    from torch import nn

    class Block(nn.Module):
        def __init__(self, ch):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)
            self.conv2, self.bn2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch)

        def forward(self, x):
            out = self.bn1(self.conv1(x)).relu()
            return (self.bn2(self.conv2(out)) + x).relu()

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         *[Block(16) for _ in range(4)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _record_steps(steps: int) -> list:
    """The raw Kineto events of each step, as the scan's session reads them."""
    import torch

    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    recorded = []
    for _ in range(steps):
        with torch.autograd.profiler.profile(record_shapes=True, use_kineto=True) as prof:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        recorded.append(prof.kineto_results.events())
    return recorded


def _best_times(old, new, steps: list, repeat: int) -> tuple[float, float]:
    """Best of ``repeat`` rounds each, the two versions alternating round by round (a shared,
    loaded machine slows some rounds; the best one is the version's own cost)."""
    best = {old: float("inf"), new: float("inf")}
    for r in range(repeat):
        for fn in ((old, new) if r % 2 else (new, old)):
            t0 = time.process_time()
            for i, events in enumerate(steps):
                fn(events, i + 1, [], None)
            best[fn] = min(best[fn], time.process_time() - t0)
    return best[old], best[new]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=BASELINE, help="git ref of the old builder (default %(default)s)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from opscope.capture.events import calls_from_kineto

    old = _old_module(args.baseline).calls_from_kineto
    steps = _record_steps(args.steps)
    n_events = sum(len(e) for e in steps)
    new_calls = [calls_from_kineto(e, i + 1, [], None) for i, e in enumerate(steps)]
    old_calls = [old(e, i + 1, [], None) for i, e in enumerate(steps)]
    same = all([c.to_dict() for c in a] == [c.to_dict() for c in b] for a, b in zip(new_calls, old_calls, strict=True))
    t_old, t_new = _best_times(old, calls_from_kineto, steps, args.repeat)
    print(f"{len(steps)} steps, {n_events} events, {sum(map(len, new_calls))} calls; same OpCalls: {same}")
    print(f"old ({args.baseline}): {t_old * 1e3:.2f} ms   new: {t_new * 1e3:.2f} ms   "
          f"per event: {t_old / n_events * 1e6:.2f} / {t_new / n_events * 1e6:.2f} µs   new/old = {t_new / t_old:.3f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
