"""What reading every operator of a step costs, per profiler event: the floor under any per-step capture.

    python bench/read_floor.py [--steps 7]

`opscope scan` reads every operator of every captured step.  This measures, on the same
training steps as `bench/scan_overhead.py` (ResNet-50 at 64 px, batch 8; the nanoGPT-style
trainer: AdamW, fp16 autocast + GradScaler, 2 accumulation micro-batches), what each part of
that reading costs in µs per profiler event and in ms per step, beside the plain step:

- record: the step's extra time under `torch.autograd.profiler.profile(record_shapes=True)`;
- stop: the profiler's own materialisation of the step's events (`__exit__`);
- touch: the least any reader pays: `events()` and each event's name, times, thread, shapes,
  dtypes and scalars read once, nothing kept;
- convert: opscope's conversion (`calls_from_kineto` + `compact_calls`: nesting, sources,
  folding), which includes the touch;
- trace: the step's Chrome trace (`export_chrome_trace`, written by the profiler in C++).

Medians over the steps after one warm-up step.  The last line says how much of a plain step
the unavoidable part (stop + touch) already is: where it is more than the ratio a benchmark
allows, no per-step reader of every operator can meet that ratio on that script.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def resnet50_step():
    sys.path.insert(0, str(ROOT / "examples"))
    from train_resnet50 import ResNet50
    model = ResNet50()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 1000, (8,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def nanogpt_step():
    sys.path.insert(0, str(ROOT / "tests" / "data" / "scripts"))
    from nanogpt_style import GPT
    torch.manual_seed(1337)
    model = GPT(65, 16)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    scaler = torch.amp.GradScaler("cpu")
    data = torch.randint(0, 65, (5000,))

    def batch():
        ix = torch.randint(len(data) - 16, (4,))
        return (torch.stack([data[i:i + 16] for i in ix]), torch.stack([data[i + 1:i + 17] for i in ix]))

    def step():
        for _ in range(2):
            x, y = batch()
            with torch.autocast("cpu", dtype=torch.float16):
                _, loss = model(x, y)
            scaler.scale(loss / 2).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return step


def touch(events) -> int:
    read = 0
    for e in events:
        fields = (e.device_type(), e.start_thread_id(), e.start_ns(), e.duration_ns(), e.name(), e.sequence_nr(),
                  e.correlation_id(), e.shapes(), e.dtypes(), e.concrete_inputs())
        read += len(fields)
    return read


def measure(step, steps: int, tmp: Path) -> dict:
    from torch.autograd.profiler import profile

    from opscope.capture.events import calls_from_kineto, compact_calls
    rows: dict[str, list[float]] = {k: [] for k in ("plain", "recorded", "stop", "touch", "convert", "trace", "n")}
    step()
    for i in range(steps + 1):
        t0 = time.perf_counter()
        step()
        plain = time.perf_counter() - t0
        runs = []
        for part in ("touch", "convert"):   # one profiled step for each reader: the same step, read fresh
            prof = profile(record_shapes=True, use_kineto=True)
            prof.__enter__()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            prof.__exit__(None, None, None)
            t2 = time.perf_counter()
            events = prof.kineto_results.events()
            if part == "touch":
                touch(events)
            else:
                compact_calls(calls_from_kineto(events, 1, [], None))
            t3 = time.perf_counter()
            prof.export_chrome_trace(str(tmp / "trace.json"))
            t4 = time.perf_counter()
            runs.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, len(events)))
        if i == 0:
            continue   # warm-up
        rows["plain"].append(plain)
        rows["recorded"].append((runs[0][0] + runs[1][0]) / 2)
        rows["stop"].append((runs[0][1] + runs[1][1]) / 2)
        rows["touch"].append(runs[0][2])
        rows["convert"].append(runs[1][2])
        rows["trace"].append((runs[0][3] + runs[1][3]) / 2)
        rows["n"].append(runs[0][4])
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("ResNet-50 (64 px, batch 8)", resnet50_step),
                           ("nanoGPT-style (fp16 autocast, 2 micro-batches)", nanogpt_step)):
            m = measure(make(), args.steps, Path(tmp))
            n = m["n"]
            print(f"{name}: {n:,.0f} profiler events a step; plain step {m['plain'] * 1e3:.1f} ms "
                  f"({m['plain'] / n * 1e6:.2f} µs an event); median of {args.steps} steps")
            print(f"  {'part':<10}{'ms/step':>10}{'µs/event':>10}{'x plain step':>14}")
            for part in ("record", "stop", "touch", "convert", "trace"):
                value = m["recorded"] - m["plain"] if part == "record" else m[part]
                print(f"  {part:<10}{value * 1e3:>10.1f}{value / n * 1e6:>10.2f}{value / m['plain']:>13.2f}x")
            floor = m["stop"] + m["touch"]
            print(f"  stop + touch (any reader of every operator): {floor * 1e3:.1f} ms a step = "
                  f"{floor / m['plain']:.2f}x a plain step\n")


if __name__ == "__main__":
    main()
