"""How fast the static migration scan is: files/s on a generated project and on torch itself.

    python bench/static_scan_speed.py [--files 500] [--no-torch]

The generated project mixes GPU training modules (DDP, AMP, apex, .cuda(), custom
extension loading) with plain CPU modules, about 150 lines each.  The second figure
scans the installed torch package's Python files: a realistic big tree (~2,000 files,
~45 MB) full of `torch.cuda` references.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

GPU_MODULE = '''"""Module {i}: training utilities (generated for the static-scan benchmark)."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader

try:
    from apex import amp
except ImportError:
    amp = None


class Block{i}(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(self.fc(x)).relu()


def setup_{i}(local_rank):
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    torch.backends.cudnn.benchmark = True
    return torch.device("cuda", local_rank)


def loader_{i}(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=True, num_workers=2)


def train_{i}(model, loader, optimizer, steps=10):
    model = model.cuda()
    scaler = torch.cuda.amp.GradScaler()
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True), y.to("cuda")
        with torch.cuda.amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % 10 == 0:
            torch.cuda.synchronize()
            print(step, loss.item(), torch.cuda.max_memory_allocated())
        if step >= steps:
            break
    return model
''' + "\n".join(f'''

def helper_{{i}}_{k}(values, scale={k}):
    """Plain Python helper {k}: no CUDA here."""
    total = 0.0
    for v in values:
        total += v * scale
    return total / max(len(values), 1)''' for k in range(12)) + "\n"

CPU_MODULE = '''"""CPU-only module {i} (generated): the scan must report nothing here."""
import json
import math


def summarise_{i}(rows):
    out = {{}}
    for key, value in rows:
        out.setdefault(key, []).append(math.sqrt(abs(value)))
    return json.dumps(out)
''' + "\n".join(f'''

def transform_{{i}}_{k}(x):
    return [v * {k} + 1 for v in x if v > 0]''' for k in range(30)) + "\n"


def make_project(root: Path, n_files: int = 500) -> Path:
    """Write ``n_files`` Python modules (3 in 4 GPU-style) under ``root`` in nested packages."""
    root = Path(root)
    for i in range(n_files):
        package = root / f"pkg{i // 25}"
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
        if i % 4 == 3:
            (package / f"cpu_{i}.py").write_text(CPU_MODULE.format(i=i), encoding="utf-8")
        else:
            (package / f"train_{i}.py").write_text(GPU_MODULE.format(i=i), encoding="utf-8")
    return root


def _time_scan(path: Path) -> tuple[int, int, float]:
    from opscope.analysis.static.scan import iter_source_files, scan_paths
    n_files = sum(1 for p in iter_source_files([path]) if p.suffix == ".py")
    t0 = time.perf_counter()
    findings = scan_paths([path])
    return n_files, len(findings), time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=500, help="modules in the generated project")
    parser.add_argument("--no-torch", action="store_true", help="skip scanning the installed torch package")
    args = parser.parse_args(argv)
    from opscope.analysis.static.scan import load_rules
    load_rules()  # yaml load is a one-off start-up cost, not per-file work
    with tempfile.TemporaryDirectory() as tmp:
        root = make_project(Path(tmp) / "proj", args.files)
        n, found, secs = _time_scan(root)
        print(f"generated project: {n} .py files, {found} findings in {secs:.2f} s "
              f"({n / secs:.0f} files/s)")
    if not args.no_torch:
        import torch
        tree = Path(torch.__file__).resolve().parent
        n, found, secs = _time_scan(tree)
        print(f"installed torch package ({tree}): {n} .py files, {found} findings in {secs:.2f} s "
              f"({n / secs:.0f} files/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
