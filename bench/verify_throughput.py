"""Operator-verification throughput: signatures verified per second.

    python bench/verify_throughput.py [RUN_DIR] [--device cpu] [--repeat 3]

Without RUN_DIR it first scans examples/train_cnn.py (3 steps, CPU).  Then it runs the
operator pass (inputs, device run, CPU reference, float64 oracle, judging) in-process
``--repeat`` times and prints signatures per second: over all signatures, and over the
ones actually replayed (pass/warn/fail/error), plus the slowest signatures.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scan_example(out: Path) -> Path:
    cmd = [sys.executable, "-m", "opscope", "scan", str(ROOT / "examples" / "train_cnn.py"), "--steps", "3",
           "--out", str(out), "--format", "", "--quiet", "--device", "cpu", "--", "--epochs", "1", "--samples", "256"]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="an `opscope scan` output folder (default: scan the CNN example)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import torch

    from opscope.model import ScanResult
    from opscope.replay.run import verify_operators
    from opscope.report.json_out import read_scan_json

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(args.run_dir) if args.run_dir else scan_example(Path(tmp) / "scan")
        scan: ScanResult = read_scan_json(run_dir)
        walls, last = [], None
        for _ in range(args.repeat):
            started = time.perf_counter()
            last = verify_operators(scan.operators, args.device, run_dir=run_dir)
            walls.append(time.perf_counter() - started)
    counts = last["counts"]
    replayed = counts["total"] - counts["skipped"]
    wall = statistics.median(walls)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
          f"run {run_dir if args.run_dir else 'examples/train_cnn.py (3 steps)'}")
    print(f"signatures: {counts['total']} ({replayed} replayed, {counts['skipped']} skipped); "
          f"outcomes: " + ", ".join(f"{k} {counts[k]}" for k in ("pass", "warn", "fail", "error", "skipped")))
    print(f"median wall over {args.repeat} runs: {wall:.2f} s "
          f"(min {min(walls):.2f}, max {max(walls):.2f})")
    print(f"throughput: {counts['total'] / wall:.1f} signatures/s overall, {replayed / wall:.1f} replayed signatures/s")
    slow = sorted(last["results"], key=lambda r: r["seconds"], reverse=True)[:5]
    print("slowest: " + "; ".join(f"{r['op']} {r['input_shapes'][:2]} {r['seconds']:.3f}s" for r in slow))
    return 0


if __name__ == "__main__":
    sys.exit(main())
