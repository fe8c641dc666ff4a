"""Memory fit, real vs fake: the same script scanned both ways, peak and parts side by side (not a timed test).

    python bench/memory_fit_agreement.py [--steps 2] [SCRIPT -- ARGS]

Without a script it runs examples/train_resnet50.py at batch 64, 224 px (about 5.4 GiB on this CPU) and the AdamW
MLP of tests/data/scripts/memory_mlp_adamw.py at batch 4096.  A real scan measures the step's memory from the
allocator's events, a fake scan from the fake storages' lifetimes (docs/guides/port-plan.md); #34 asks that they
agree within 10 %.  Also prints each scan's wall seconds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = [(ROOT / "examples" / "train_resnet50.py", ["--dummy", "-b", "64", "--epochs", "1", "--samples", "192"]),
         (ROOT / "tests" / "data" / "scripts" / "memory_mlp_adamw.py", ["--batch", "4096"])]
PARTS = ("parameters", "gradients", "optimizer_state", "activations")


def scan(script: Path, args: list[str], mode: str, steps: int, out: Path) -> tuple[dict, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(script), "--mode", mode, "--steps", str(steps),
                           "--out", str(out), "--format", "json", "--quiet", "--", *args],
                          capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{script.name} --mode {mode} failed: {proc.stderr.strip().splitlines()[-1:]}")
    fit = json.loads((out / "scan.json").read_text(encoding="utf-8"))["memory_fit"]
    return fit, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("script", nargs="?")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    suite = [(Path(a.script), [x for x in a.args if x != "--"])] if a.script else SUITE
    for script, args in suite:
        with tempfile.TemporaryDirectory() as tmp:
            fits = {m: scan(script, args, m, a.steps, Path(tmp) / m) for m in ("real", "fake")}
        print(f"\n{script.name} {' '.join(args)}")
        print(f"{'':18s}{'real':>14s}{'fake':>14s}{'real/fake':>11s}")
        rows = [("peak", "peak_bytes")] + [(p, p) for p in PARTS]
        for label, key in rows:
            real = fits["real"][0]["peak_bytes"] if key == "peak_bytes" else fits["real"][0]["parts"][key]
            fake = fits["fake"][0]["peak_bytes"] if key == "peak_bytes" else fits["fake"][0]["parts"][key]
            ratio = f"{real / fake:.4f}" if fake else "-"
            print(f"{label:18s}{real / 2**20:12,.1f} M{fake / 2**20:12,.1f} M{ratio:>11s}")
        print(f"{'scan seconds':18s}{fits['real'][1]:14.1f}{fits['fake'][1]:14.1f}")
        print(f"{'peak phase':18s}{str(fits['real'][0].get('peak_phase')):>14s}{str(fits['fake'][0].get('peak_phase')):>14s}")


if __name__ == "__main__":
    main()
