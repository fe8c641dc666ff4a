"""Capture memory: peak RSS of `opscope scan` against the plain run, and of a long scan against a short one.

    python bench/scan_memory.py [--repeat 1] [--long-steps 200] [--short-steps 20]

Two comparisons, printed side by side with their ratios:
- generate-in-loop: tests/data/scripts/char_gpt_sampling.py samples 300 tokens after every
  training iteration (a sampling callback inside the step).  Plain run of N iterations vs
  `opscope scan --steps N` of the same script and arguments.  Target: scan <= 2x plain.
- long vs short scan: examples/train_cnn.py (the same dataset size for both) scanned for 20
  and for 200 steps.  Capture memory must not grow with the number of steps.  Target:
  200 steps <= 1.2x 20 steps.
- real size (``--real-size``, issue 41): examples/train_resnet50.py --dummy -b 64 (224 px) for 3 steps,
  plain vs `opscope scan --steps 3`, wall time and peak RSS, and which steps the scan recorded only in
  part; then tests/data/scripts/capture_budget.py with a runaway step (60,000 tiny calls) under
  ``--max-capture-mb 150``: that step must be cut.  Target: every ResNet-50 step whole, scan <= 1.5x plain.
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
import time
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


def cut_steps(out: Path) -> dict[int, str]:
    """Steps the capture recorded only in part: step -> "after N calls (reason)"."""
    cut = {}
    for line in (out / "capture" / "steps.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["unrecorded"].get("after_calls"):
            u = record["unrecorded"]
            cut[record["step"]] = f"after {u['after_calls']} calls ({u.get('reason', '--max-step-calls')})"
    return cut


def real_size(repeat: int) -> None:
    """ResNet-50 b64 plain vs scan (wall time, peak RSS, cut steps), and a runaway capture stopped."""
    sys.path.insert(0, str(ROOT / "bench"))
    from scan_overhead import RUNNER  # plain: the script with only opscope's CUDA->CPU remap, stopped after N steps
    r50 = str(ROOT / "examples" / "train_resnet50.py")
    r50_args = ["--dummy", "-b", "64", "--samples", "192"]   # 3 steps of 64
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r50"
        runner = Path(tmp) / "runner.py"
        runner.write_text(RUNNER)
        runs = {"plain ResNet-50 b64, 3 steps": [sys.executable, str(runner), "plain", "3", r50, *r50_args],
                "scan ResNet-50 b64, 3 steps": [sys.executable, "-m", "opscope", "scan", r50, "--steps", "3", "--out",
                                                str(out), "--format", "", "--quiet", "--", *r50_args]}
        peaks: dict[str, list] = {name: [] for name in runs}
        walls: dict[str, list] = {name: [] for name in runs}
        for _ in range(repeat):
            for name, cmd in runs.items():
                start = time.perf_counter()
                peaks[name].append(peak_mb(cmd))
                walls[name].append(time.perf_counter() - start)
        cut = cut_steps(out)
        runaway = Path(tmp) / "runaway"
        peak_mb([sys.executable, "-m", "opscope", "scan", str(ROOT / "tests" / "data" / "scripts" / "capture_budget.py"),
                 "--steps", "2", "--out", str(runaway), "--format", "", "--quiet", "--max-capture-mb", "150",
                 "--max-step-calls", "1000000", "--", "--batch", "64", "--runaway", "60000"])
        runaway_cut = cut_steps(runaway)
    print(f"median of {repeat} interleaved run(s)")
    print(f"{'run':<32}{'wall s':>10}{'peak MB':>10}")
    for name in runs:
        print(f"{name:<32}{statistics.median(walls[name]):>10.1f}{statistics.median(peaks[name]):>10.0f}")
    names = list(runs)
    print(f"scan / plain: wall {statistics.median(walls[names[1]]) / statistics.median(walls[names[0]]):.2f}x, "
          f"peak RSS {statistics.median(peaks[names[1]]) / statistics.median(peaks[names[0]]):.2f}x (target <= 1.5x)")
    print(f"ResNet-50 steps recorded in part: {cut or 'none'}")
    print(f"runaway capture (--max-capture-mb 150), steps cut: {runaway_cut or 'none (FAIL)'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--iters", type=int, default=6, help="training iterations of the sampling script")
    parser.add_argument("--short-steps", type=int, default=20)
    parser.add_argument("--long-steps", type=int, default=200)
    parser.add_argument("--real-size", action="store_true", help="ResNet-50 b64 and a runaway capture (issue 41)")
    args = parser.parse_args()
    if args.real_size:
        real_size(args.repeat)
        return
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
