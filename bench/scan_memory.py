"""Capture memory: peak RSS of `opscope scan` against the plain run, and of a long scan against a short one.

    python bench/scan_memory.py [--repeat 1] [--long-steps 200] [--short-steps 20]

Two comparisons, printed side by side with their ratios:
- generate-in-loop: tests/data/scripts/char_gpt_sampling.py samples 300 tokens after every
  training iteration (a sampling callback inside the step).  Plain run of N iterations vs
  `opscope scan --steps N` of the same script and arguments.  Target: scan <= 2x plain.
- long vs short scan: examples/train_cnn.py (the same dataset size for both) scanned for 20
  and for 200 steps.  Capture memory must not grow with the number of steps.  Target:
  200 steps <= 1.2x 20 steps.
Peak RSS is the largest process of each run (the scan's capture child included), read with
getrusage(RUSAGE_CHILDREN) in a fresh wrapper per run.  Runs are interleaved; medians printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
           "stderr=subprocess.PIPE); r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
           "print(r, p.returncode); sys.stderr.write(p.stderr.decode()[-2000:] if p.returncode else '')")


def peak_mb(cmd: list[str]) -> float:
    """Peak RSS (MB) of the largest process that ``cmd`` ran."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, cwd=ROOT, env=env)
    kb, code = proc.stdout.split()
    if code != "0":
        raise SystemExit(f"command failed ({code}): {' '.join(cmd)}\n{proc.stderr}")
    return int(kb) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--iters", type=int, default=6, help="training iterations of the sampling script")
    parser.add_argument("--short-steps", type=int, default=20)
    parser.add_argument("--long-steps", type=int, default=200)
    args = parser.parse_args()
    gen = str(ROOT / "tests" / "data" / "scripts" / "char_gpt_sampling.py")
    gen_args = ["--iters", str(args.iters), "--sample-len", "300", "--sample-every", "1"]
    cnn = str(ROOT / "examples" / "train_cnn.py")
    with tempfile.TemporaryDirectory() as tmp:
        def scan(script, steps, script_args, name):
            return [sys.executable, "-m", "opscope", "scan", script, "--steps", str(steps), "--out",
                    str(Path(tmp) / name), "--format", "", "--quiet", "--no-traces", "--", *script_args]

        def cnn_args(steps):   # the same data for both: only the number of captured steps differs
            return ["--epochs", "1", "--samples", str(32 * (args.long_steps + 2))]

        runs = {
            "plain (generate-in-loop)": [sys.executable, gen, "--device", "cpu", *gen_args],
            "scan (generate-in-loop)": scan(gen, args.iters, gen_args, "gen"),
            f"scan {args.short_steps} steps": scan(cnn, args.short_steps, cnn_args(args.short_steps), "short"),
            f"scan {args.long_steps} steps": scan(cnn, args.long_steps, cnn_args(args.long_steps), "long"),
        }
        peaks = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, cmd in runs.items():
                peaks[name].append(peak_mb(cmd))
        steps_done = {name: len(json.loads((Path(tmp) / d / "scan.json").read_text())["steps"])
                      for name, d in (("gen", "gen"), ("short", "short"), ("long", "long"))}
    med = {name: statistics.median(v) for name, v in peaks.items()}
    names = list(runs)
    print(f"peak RSS, median of {args.repeat} interleaved run(s); steps captured: {steps_done}")
    print(f"{'run':<28}{'peak MB':>10}")
    for name in names:
        print(f"{name:<28}{med[name]:>10.0f}")
    gen_ratio = med[names[1]] / med[names[0]]
    long_ratio = med[names[3]] / med[names[2]]
    print(f"generate-in-loop: scan / plain = {gen_ratio:.2f}x (target <= 2x)")
    print(f"{args.long_steps} / {args.short_steps} steps = {long_ratio:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
