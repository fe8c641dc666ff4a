"""The NPU estimate across torchvision classifiers, with the checks that found its structural errors (#33).

    python bench/torchvision_estimates.py [--archs resnet50 vit_b_16 ...] [--chips Ascend910A Ascend910B2]
                                          [--batch 64] [--out /tmp/tv-estimates]

Each architecture is scanned in fake mode (no real tensors, so any size runs here) through the bundled
examples/train_resnet50.py with ``-a ARCH`` (needs a torchvision that imports; the dev venv's mismatched one
works with PYTHONPATH=tests/data/scripts/frameworks/tv_shim), then re-priced per chip with ``opscope report
--chip``.  Printed per architecture and chip: the step's device and host time and its largest kernel types,
and every row a reader should not see: an operator priced with no kernel mapping, a kernel that moves no
bytes, an `unfused` reason, a vector kernel priced above the chip's HBM bandwidth without fitting its L2.
Not a timed test and not an accuracy check (no NPU timings here): a structural survey, to rerun after a
change to the cost model and compare.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHS = ["resnet50", "resnet18", "mobilenet_v2", "mobilenet_v3_large", "densenet121", "efficientnet_b0",
         "inception_v3", "vgg16", "vit_b_16", "convnext_tiny", "shufflenet_v2_x1_0", "regnet_y_400mf"]


def scan(arch: str, batch: int, chip: str, out: Path) -> dict | None:
    size = "299" if arch == "inception_v3" else "224"
    cmd = [sys.executable, "-m", "opscope", "scan", str(ROOT / "examples" / "train_resnet50.py"), "--mode", "fake",
           "--steps", "2", "--chip", chip, "--format", "json", "--quiet", "--out", str(out), "--", "--dummy",
           "-a", arch, "-b", str(batch), "--epochs", "1", "--samples", str(batch * 3), "--image-size", size]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(f"{arch}: scan exited {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads((out / "scan.json").read_text(encoding="utf-8"))


def reprice(run: Path, chip: str, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "opscope", "report", str(run), "--chip", chip, "--format", "json",
                    "--quiet", "--out", str(out)], check=True, capture_output=True, timeout=600)
    return json.loads((out / "scan.json").read_text(encoding="utf-8"))


def flags(estimate: dict, chip: str) -> list[str]:
    from opscope.analysis.npu.cost import Kernel, resolve_chip, vector_rate
    _, figures = resolve_chip(chip)
    out = []
    for row in estimate["rows"]:
        if row["kind"] != "operator":
            continue
        if "unmapped" in (row.get("reason_kinds") or []):
            out.append(f"no kernel mapping: {row['operator']} ({row['npu_time_us']:.0f} us)")
        if "unfused" in (row.get("reason_kinds") or []):
            out.append(f"unfused: {row['operator']} at {row['source']}")
    for row in estimate["basis"]["rows"]:
        for k in row["kernels"]:
            kernel = Kernel(**k)
            sized = any(isinstance(s, list) and s and all(isinstance(d, int) for d in s)
                        for s in row.get("input_shapes") or [])
            if kernel.unit == "vector" and not kernel.bytes and sized:
                out.append(f"0 bytes: {row['name']} {kernel.type}")
            if kernel.unit == "vector" and vector_rate(kernel, figures)[0] > float(figures.get("hbm_gbps") or 0) \
                    and kernel.bytes > float(figures.get("l2_mib") or 0) * 2 ** 20:
                out.append(f"above HBM outside L2: {row['name']} {kernel.type}")
    return sorted(set(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=ARCHS)
    ap.add_argument("--chips", nargs="+", default=["Ascend910A", "Ascend910B2"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default="/tmp/tv-estimates")
    args = ap.parse_args()
    base = Path(args.out)
    print(f"{'arch':20s}{'chip':>13s}{'device ms':>11s}{'host ms':>9s}  largest kernel types (ms)")
    for arch in args.archs:
        run = base / arch
        scanned = scan(arch, args.batch, args.chips[0], run)
        if scanned is None:
            continue
        for chip in args.chips:
            data = scanned if chip == args.chips[0] else reprice(run, chip, base / f"{arch}-{chip}")
            est = data["npu_estimate"]
            step = est["step"]
            top = sorted(step["kernel_types_us"].items(), key=lambda kv: -kv[1])[:4]
            print(f"{arch:20s}{chip:>13s}{step['device_us'] / 1e3:11.2f}{step['host_us'] / 1e3:9.2f}  "
                  + ", ".join(f"{t} {v / 1e3:.1f}" for t, v in top))
            for line in flags(est, chip):
                print(f"{'':22s}! {line}")


if __name__ == "__main__":
    main()
