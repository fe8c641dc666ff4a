"""Benchmark: opscope's trace loader vs json.load vs HolisticTraceAnalysis on a big trace.

Generates a >= 100 MB Kineto-style Chrome trace with a realistic event mix (nested
cpu_op events with shapes/types/concrete inputs, python_function frames, CUDA runtime
launches, GPU kernels, ac2g and fwdbwd flows, ProfilerStep markers), then loads it
with each contender in a fresh subprocess and prints time and peak memory side by
side.  Peak memory = growth of the process's max RSS during the load.

    python bench/parse_trace.py [--size-mb 110] [--trace FILE] [--hta-python PYTHON]

HTA is not an opscope dependency: install it in a separate environment
(``pip install HolisticTraceAnalysis``) and pass its interpreter with --hta-python.
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAYERS = [("aten::linear", [[64, 1024], [4096, 1024], [4096]]), ("aten::conv2d", [[64, 256, 28, 28], [256, 256, 3, 3], [256]]),
          ("aten::layer_norm", [[64, 128, 1024], [1024], [1024]]), ("aten::matmul", [[64, 16, 128, 64], [64, 16, 64, 128]])]
CHILDREN = {"aten::linear": ["aten::t", "aten::addmm"], "aten::conv2d": ["aten::convolution", "aten::_convolution", "aten::cudnn_convolution"],
            "aten::layer_norm": ["aten::native_layer_norm", "aten::empty_like"], "aten::matmul": ["aten::expand", "aten::reshape", "aten::bmm"]}


class _Writer:
    def __init__(self, fh):
        self.fh, self.first = fh, True

    def __call__(self, event):
        self.fh.write(("  " if self.first else ",\n  ") + json.dumps(event))
        self.first = False


def generate(path: Path, size_mb: float) -> None:
    """Write a trace of at least ``size_mb`` MB."""
    rng = random.Random(0)
    target = size_mb * 1e6
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n'
                 '  "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85000000000}],\n'
                 '  "traceEvents": [\n')
        out = _Writer(fh)
        for pid, name in ((1, "python"), (0, "GPU 0")):
            out({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        ts, corr, ext, step = 1_000_000.0, 1, 1, 0
        while fh.tell() < target:
            step += 1
            step_start = ts
            for phase in ("forward", "backward"):
                for layer in range(48):
                    op, shapes = LAYERS[layer % len(LAYERS)]
                    start, ts = ts, ts + 1.0
                    if phase == "backward":
                        out({"ph": "X", "cat": "cpu_op", "name": f"autograd::engine::evaluate_function: {op}Backward0",
                             "pid": 1, "tid": 2, "ts": start - 0.5, "dur": 60.0, "args": {"Sequence number": layer}})
                    out({"ph": "X", "cat": "python_function", "name": "torch/nn/modules/module.py(1527): _call_impl",
                         "pid": 1, "tid": 1, "ts": start - 0.8, "dur": 59.0, "args": {"Python id": ext, "Python parent id": ext - 1}})
                    tid = 1 if phase == "forward" else 2
                    out({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": tid, "ts": start, "dur": 55.0,
                         "args": {"External id": ext, "Sequence number": layer, "Fwd thread id": 0, "Record function id": 0,
                                  "Concrete Inputs": ["", "", ""] + [str(rng.randint(0, 3))] * 2,
                                  "Input type": ["float", "float", "float", "Scalar", "Scalar"],
                                  "Input Strides": [[s for s in sh] for sh in shapes] + [[], []],
                                  "Input Dims": shapes + [[], []], "Ev Idx": ext}})
                    ext += 1
                    for child in CHILDREN[op]:
                        out({"ph": "X", "cat": "cpu_op", "name": child, "pid": 1, "tid": tid, "ts": ts, "dur": 10.0,
                             "args": {"External id": ext, "Sequence number": -1, "Input type": ["float", "float"],
                                      "Input Dims": shapes[:2], "Input Strides": shapes[:2], "Ev Idx": ext}})
                        out({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                             "ts": ts + 2, "dur": 5.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
                        out({"ph": "s", "id": corr, "pid": 1, "tid": tid, "ts": ts + 2, "cat": "ac2g", "name": "ac2g"})
                        kts = ts + 40 + rng.random() * 10
                        out({"ph": "X", "cat": "kernel", "name": f"void at::native::kernel_{child[6:]}<float, 128>(float*, int)",
                             "pid": 0, "tid": 7, "ts": kts, "dur": 20.0 + rng.random() * 80,
                             "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": 7,
                                      "correlation": corr, "registers per thread": 32, "shared memory": 0,
                                      "blocks per SM": 0.5, "warps per SM": 2.0, "grid": [128, 1, 1],
                                      "block": [128, 1, 1], "est. achieved occupancy %": 25}})
                        out({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": kts, "cat": "ac2g", "name": "ac2g", "bp": "e"})
                        corr, ext, ts = corr + 1, ext + 1, ts + 12.0
                    if phase == "forward" and layer % 8 == 0:
                        out({"ph": "s", "id": ext, "pid": 1, "tid": 1, "ts": start, "cat": "fwdbwd", "name": "fwdbwd"})
                        out({"ph": "f", "id": ext, "pid": 1, "tid": 2, "ts": start + 5e4, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})
                    ts = start + 60.0
            out({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                 "ts": step_start - 2.0, "dur": ts - step_start + 4.0, "args": {"External id": ext}})
            ts += 10.0
        fh.write('\n  ],\n  "traceName": "bench"\n}\n')


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(kind: str, path: str) -> dict:
    """Run inside the child process: load once, report seconds and peak-RSS growth."""
    if kind == "opscope":
        from opscope.parsers import load_profile
        base, t = _peak_mb(), time.perf_counter()
        prof = load_profile(path)
        n = len(prof.calls)
    elif kind == "json":
        base, t = _peak_mb(), time.perf_counter()
        with open(path, encoding="utf-8") as fh:
            n = len(json.load(fh)["traceEvents"])
    else:
        from hta.common.trace import Trace
        trace = Trace(trace_files={0: path}, trace_dir=str(Path(path).parent))
        base, t = _peak_mb(), time.perf_counter()
        trace.parse_traces(max_ranks=1, use_multiprocessing=False, use_memory_profiling=False)
        n = len(trace.get_trace(0))
    return {"seconds": time.perf_counter() - t, "peak_mb": _peak_mb() - base, "items": n}


def _run_child(python: str, kind: str, path: Path) -> dict | str:
    proc = subprocess.run([python, __file__, "--measure", kind, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=110.0)
    parser.add_argument("--trace", help="use this trace instead of generating one")
    parser.add_argument("--hta-python", default=sys.executable, help="interpreter that has HTA installed")
    parser.add_argument("--measure", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return 0
    tmp = None
    if args.trace:
        path = Path(args.trace)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="opscope-bench-")
        path = Path(tmp.name) / "rank0_trace.json"
        t = time.perf_counter()
        generate(path, args.size_mb)
        print(f"generated {path} in {time.perf_counter() - t:.1f}s")
    size_mb = path.stat().st_size / 1e6
    print(f"trace: {size_mb:.1f} MB")
    results = {"opscope": _run_child(sys.executable, "opscope", path),
               "json.load": _run_child(sys.executable, "json", path),
               "HTA": _run_child(args.hta_python, "hta", path)}
    print(f"{'loader':<10} {'seconds':>9} {'peak MB':>9} {'peak/file':>10}  items")
    for name, res in results.items():
        if isinstance(res, str):
            print(f"{name:<10} not measured: {res}" + ("  (pip install HolisticTraceAnalysis, then --hta-python)"
                                                       if name == "HTA" else ""))
            continue
        print(f"{name:<10} {res['seconds']:>9.2f} {res['peak_mb']:>9.0f} {res['peak_mb'] / size_mb:>10.2f}  {res['items']}")
    ours, hta = results["opscope"], results["HTA"]
    if isinstance(ours, dict) and isinstance(hta, dict):
        print(f"opscope vs HTA: {hta['seconds'] / ours['seconds']:.1f}x faster (target >= 3x); "
              f"peak memory {ours['peak_mb'] / size_mb:.2f}x the file size (target < 2x)")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
