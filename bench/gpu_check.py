"""The GPU check: what opscope gets right on a real CUDA GPU, as one Markdown table (issue 40).

    python bench/gpu_check.py [--out docs/measured/gpu.md] [--work DIR]
    python bench/gpu_check.py --from DIR          # the table of runs made before (no GPU needed)

On a machine with a GPU it runs, in a few minutes:

- the bundled CNN (`examples/train_cnn.py`) scanned on the GPU, judged again with `report --target 2.14.0`,
  and replayed with `opscope verify RUN --device cuda`;
- a GPT-2-small-like nanoGPT run (`tests/data/scripts/frameworks/nanogpt_train.py`, 12 layers, 12 heads, width
  768, block 1024, batch 12, bf16 autocast, fused AdamW, no compile) four ways: plain, inside a bare
  `torch.profiler.profile(record_shapes=True)` with CPU activity and with CPU+CUDA activity, and under
  `opscope scan --steps 20`; the plain run prints `torch.cuda.max_memory_allocated()` at exit.

and prints one row per figure of issue 40's table: kernel time in scan.json against the exported traces' kernel
total, backend kernels judged unsupported / cpu-fallback / unknown, verify's failures on the CNN, the memory fit's
peak against `max_memory_allocated`, and the median iteration of each GPT-2 run (iterations 3 onwards). Each row
says what the issue asks and whether it is met. `--out FILE` appends the dated table (date, commit, GPU, torch) to
FILE; `--work DIR` keeps the runs (default: a temporary folder). `--tests` also runs the test suite here (its `gpu`
tests included; longer than the rest) and adds pytest's summary as a row. `--from DIR` builds the table from such a
folder, or from one laid out like it (`cnn/`, `gpt2/` run folders, `logs/*.txt`), without running anything.

Exit status: 0 the table was written; 1 a run it needs failed (the table is written with what could be
measured); 3 no CUDA GPU is visible here (one line on stderr, nothing run).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "train_cnn.py"
NANOGPT = ROOT / "tests" / "data" / "scripts" / "frameworks" / "nanogpt_train.py"
GPT2_ARGS = ["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--batch_size=12",
             "--dropout=0.0", "--compile=False", "--max_iters=24"]
SCAN_STEPS = 20
TARGET = "2.14.0"
NO_GPU = 3
RUN_FAILED = 1

# backend kernels: the ops a GPU run records in place of the public op the NPU runs (issue 40, item 2)
BACKEND_KERNEL = re.compile(r"cudnn|miopen|_flash_attention|_efficient_attention|_fused_dropout"
                            r"|_scaled_dot_product_(cudnn|flash|efficient)_attention|_batch_norm_impl_index")
BAD_VERDICTS = ("unsupported", "cpu-fallback", "unknown")
DEVICE_TASKS = ("kernel", "gpu_memcpy", "gpu_memset")
ITER = re.compile(r"^iter (\d+):.*?time ([0-9.]+)\s*ms", re.M)
PEAK = re.compile(r"^PEAK (\{.*\})\s*$", re.M)
SUMMARY = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)* in [0-9.]+s[^=\n]*)", re.M)   # pytest's last line

# plain / bare-profiler runs of a script: the profiler spans the whole script, as in the floor
# (the profiler's events are never read: the floor is what recording costs, and reading them would take minutes)
RUNNER = r'''
import json, os, runpy, sys, traceback
mode, script = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
import torch
if mode != "plain":
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if mode == "profiler-cuda" else [])
    profile(activities=acts, record_shapes=True).__enter__()
rc = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exc:
    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
except BaseException:
    traceback.print_exc()
    rc = 1
peak = {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved()}
print("PEAK " + json.dumps(peak), flush=True)
sys.stderr.flush()
os._exit(rc)
'''


@dataclass
class Row:
    what: str
    measured: str
    wanted: str
    met: bool | None = None     # None: nothing to judge (not measured, or a figure without a bar)


# -- reading runs (pure: no GPU, no torch) -------------------------------------------------------------

def load_json(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def trace_paths(run: Path, scan: dict) -> list[Path]:
    """The run's exported traces: those scan.json lists (or their gzipped copies)."""
    paths = []
    for rel in scan.get("traces") or []:
        path = run / rel
        if not path.exists() and Path(f"{path}.gz").exists():
            path = Path(f"{path}.gz")
        if path.exists():
            paths.append(path)
    return paths


def trace_device_time(traces: list[Path]) -> dict:
    """Device time in the traces (µs): ``kernel`` alone, ``tasks`` with memcpy and memset, and ``by_op``: the
    kernel time of each operator name, the operator being the innermost one around the launch (Kineto gives a
    kernel the ``External id`` of that operator)."""
    kernel = tasks = 0.0
    by_op: dict[str, float] = {}
    for path in traces:
        events = load_json(path).get("traceEvents", [])
        names = {ev["args"].get("External id"): ev.get("name") for ev in events
                 if ev.get("cat") == "cpu_op" and isinstance(ev.get("args"), dict)}
        for ev in events:
            if ev.get("cat") not in DEVICE_TASKS:
                continue
            dur = float(ev.get("dur") or 0.0)
            tasks += dur
            if ev.get("cat") != "kernel":
                continue
            kernel += dur
            owner = names.get((ev.get("args") or {}).get("External id"))
            if owner:
                by_op[owner] = by_op.get(owner, 0.0) + dur
    return {"kernel": kernel, "tasks": tasks, "by_op": by_op}


def silent_launchers(scan: dict, by_op: dict) -> list[str]:
    """Operators of scan.json that launched kernels in the traces yet hold no device time. An operator the
    scan folds into its public op (a backend kernel such as ``aten::cudnn_convolution``) is not listed in scan.json
    and is not asked about: its time is its public op's."""
    own: dict[str, float] = {}
    for op in scan.get("operators") or []:
        if op.get("on_device", True):
            own[op["name"]] = own.get(op["name"], 0.0) + float(op.get("device_time_us") or 0.0)
    return sorted(name for name, us in by_op.items() if us > 0 and name in own and own[name] <= 0)


def kernel_rows(label: str, run: Path) -> list[Row]:
    scan = load_json(run / "scan.json")
    traces = trace_paths(run, scan)
    if not traces:
        return [Row(f"{label}: kernel time in scan.json vs the traces", "no exported trace", "within 5 %")]
    dev = trace_device_time(traces)
    mine = sum(float(op.get("device_time_us") or 0.0) for op in scan.get("operators") or [])
    n = len(traces)
    low, high = 0.95 * dev["kernel"], 1.05 * dev["tasks"]
    within = dev["kernel"] > 0 and low <= mine <= high
    measured = (f"{mine / n / 1000:.3f} ms/step vs {dev['kernel'] / n / 1000:.3f} ms of kernels "
                f"({dev['tasks'] / n / 1000:.3f} ms with copies and sets), {n} steps")
    silent = silent_launchers(scan, dev["by_op"])
    shown = ", ".join(f"`{s}`" for s in silent[:6]) + (f" and {len(silent) - 6} more" if len(silent) > 6 else "")
    return [Row(f"{label}: kernel time in scan.json (sum of `device_time_us`) vs the traces' kernels", measured,
                "within 5 % of the traces' kernel total", within),
            Row(f"{label}: operators that launched kernels but hold no device time",
                f"{len(silent)}" + (f": {shown}" if silent else ""), "0", not silent)]


def backend_row(label: str, judged: dict) -> Row:
    """Backend kernels of a scan judged (with ``report --target``) unsupported, cpu-fallback or unknown."""
    bad = sorted({f"`{op['name']}` {op.get('verdict')}" for op in judged.get("operators") or []
                  if BACKEND_KERNEL.search(op["name"]) and op.get("verdict") in BAD_VERDICTS})
    score = (judged.get("summary") or {}).get("readiness_score")
    measured = f"{len(bad)}" + (f": {', '.join(bad)}" if bad else "") + f"; readiness {score}"
    return Row(f"{label}: backend kernels unsupported / cpu-fallback / unknown at torch_npu {TARGET}", measured,
               "0", not bad)


def verify_row(label: str, scan: dict, rc: int | None) -> Row:
    counts = (scan.get("verification") or {}).get("counts") or {}
    if not counts:
        return Row(f"{label}: `opscope verify RUN --device cuda`", "not recorded", "exit 0, 0 fail")
    fail, err = counts.get("fail", 0), counts.get("error", 0)
    shown = ", ".join(f"{counts[k]} {k}" for k in ("pass", "warn", "fail", "error") if counts.get(k))
    code = f"exit {rc}: " if rc is not None else ""
    return Row(f"{label}: `opscope verify RUN --device cuda`", code + shown, "exit 0, 0 fail",
               fail == 0 and err == 0 and rc in (0, None))


def memory_row(label: str, scan: dict, peak_log: str | None) -> Row:
    fit = scan.get("memory_fit") or {}
    found = PEAK.findall(peak_log or "")
    allocated = json.loads(found[-1]).get("max_allocated") if found else None
    fit_peak = fit.get("peak_bytes")
    what = f"{label}: memory fit peak vs `torch.cuda.max_memory_allocated()` of a plain run"
    if fit_peak is None or not allocated:
        return Row(what, f"fit {fit_peak if fit_peak is not None else 'none'}, allocator {allocated or '?'}",
                   "within 2 %")
    ratio = fit_peak / allocated
    return Row(what, f"{fit_peak:,} vs {allocated:,} B ({ratio:.4f})", "within 2 %", abs(ratio - 1) <= 0.02)


def median_iteration_ms(log: str | None, first: int = 3) -> float | None:
    """Median of nanoGPT's ``iter N: ... time X ms`` lines from iteration ``first`` on (warm-up left out)."""
    times = [float(ms) for it, ms in ITER.findall(log or "") if int(it) >= first]
    return statistics.median(times) if times else None


def overhead_rows(label: str, logs: dict[str, str | None]) -> list[Row]:
    plain = median_iteration_ms(logs.get("plain"))
    cpu = median_iteration_ms(logs.get("profiler-cpu"))
    cuda = median_iteration_ms(logs.get("profiler-cuda"))
    scan = median_iteration_ms(logs.get("scan"))

    def ms(v):
        return f"{v:.1f}" if v is not None else "?"
    measured = f"plain {ms(plain)}; bare profiler {ms(cpu)} CPU, {ms(cuda)} CPU+CUDA; scan {ms(scan)}"
    floor = cuda or cpu
    rows = [Row(f"{label}: median iteration, ms", measured, "-")]
    if scan and plain and floor:
        rows.append(Row(f"{label}: scan / plain, scan / bare profiler (CPU+CUDA)",
                        f"{scan / plain:.1f}x, {scan / floor:.1f}x", "≤ 2x the profiler", scan <= 2 * floor))
    return rows


def read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else None


def build_rows(work: Path) -> list[Row]:
    """Every row of the table from a folder of runs: ``cnn/`` and ``gpt2/`` (scan folders), their judged copies
    ``cnn-judged/`` and ``gpt2-judged/`` (``report --target``; judged here when missing), ``logs/*.txt``."""
    logs = work / "logs"
    state = load_json(work / "gpu_check.json") if (work / "gpu_check.json").exists() else {}
    rows: list[Row] = []
    for label, name in (("CNN", "cnn"), ("GPT-2 small", "gpt2")):
        run = work / name
        if not (run / "scan.json").exists():
            rows.append(Row(f"{label}: scan", "no scan.json", "a scan", False))
            continue
        scan = load_json(run / "scan.json")
        rows += kernel_rows(label, run)
        judged = judge(run, work / f"{name}-judged")
        rows.append(backend_row(label, judged) if judged else
                    Row(f"{label}: backend kernels at torch_npu {TARGET}", "report --target failed", "0", False))
        if name == "cnn":
            rows.append(verify_row(label, scan, state.get("verify_rc")))
        else:
            rows.append(memory_row(label, scan, read_text(logs / "gpt2_peak.txt") or read_text(logs / "gpt2_plain.txt")))
    rows += overhead_rows("GPT-2 small", {
        "plain": read_text(logs / "gpt2_plain.txt"), "profiler-cpu": read_text(logs / "gpt2_floor_cpu.txt"),
        "profiler-cuda": read_text(logs / "gpt2_floor_cuda.txt"), "scan": read_text(logs / "gpt2_scan.txt")})
    suite = read_text(logs / "pytest.txt")
    if suite is not None:
        rows.append(suite_row(suite))
    return rows


def suite_row(log: str) -> Row:
    """The test suite run on this machine (``--tests``): pytest's last summary line."""
    found = SUMMARY.findall(log)
    summary = found[-1].strip("= ") if found else "no summary (see logs/pytest.txt)"
    return Row("`python -m pytest tests/` on this machine", summary, "no failure",
               bool(found) and not re.search(r"\b(failed|error|errors)\b", summary))


def judge(run: Path, out: Path) -> dict | None:
    """scan.json judged again for torch_npu TARGET (``opscope report --target``, written to ``out``)."""
    if not (out / "scan.json").exists():
        proc = subprocess.run([sys.executable, "-m", "opscope", "report", str(run), "--target", TARGET,
                               "--format", "json", "-o", str(out), "-q"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0 or not (out / "scan.json").exists():
            return None
    return load_json(out / "scan.json")


def render(rows: list[Row], meta: dict) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")
    mark = {True: "yes", False: "**no**", None: "-"}
    head = (f"### {meta.get('date', '?')}, commit {meta.get('commit', '?')}, {meta.get('gpu', '?')}, "
            f"torch {meta.get('torch', '?')}\n\n")
    lines = ["| what | measured | wanted | met |", "|---|---|---|---|"]
    lines += [f"| {cell(r.what)} | {cell(r.measured)} | {cell(r.wanted)} | {mark[r.met]} |" for r in rows]
    tail = f"\n\n`{meta['command']}`" + (f", {meta['wall_s']:.0f} s" if meta.get("wall_s") else "") + "\n"
    return head + "\n".join(lines) + tail


# -- running (needs a GPU) ------------------------------------------------------------------------------

def gpu_name() -> str | None:
    """The first CUDA device's name, or None when this process sees none."""
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def _run(cmd: list, log: Path, timeout: int) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="200")
    try:
        proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env=env)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        text, rc = (out.decode(errors="replace") if isinstance(out, bytes) else out) + "\n[timed out]\n", 124
    log.write_text(text, encoding="utf-8")
    print(f"  {log.name}: exit {rc}", file=sys.stderr)
    return rc


def run_all(work: Path, tests: bool = False) -> dict:
    """Every run of the table into ``work`` (and the test suite when ``tests``); returns the exit codes."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for stale in ("cnn-judged", "gpt2-judged", "logs/pytest.txt"):   # an earlier check's, in a kept --work
        path = work / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    opscope = [sys.executable, "-m", "opscope"]
    rc = {"cnn_scan": _run(opscope + ["scan", CNN, "--steps", "5", "--out", work / "cnn", "--format", "",
                                      "--quiet", "--", "--epochs", "1"], logs / "cnn_scan.txt", 300)}
    rc["verify_rc"] = _run(opscope + ["verify", work / "cnn", "--device", "cuda", "-q"], logs / "verify_cnn_cuda.txt",
                           300)
    for mode, name in (("plain", "gpt2_plain"), ("profiler-cpu", "gpt2_floor_cpu"),
                       ("profiler-cuda", "gpt2_floor_cuda")):
        rc[name] = _run([sys.executable, "-c", RUNNER, mode, NANOGPT, *GPT2_ARGS], logs / f"{name}.txt", 300)
    rc["gpt2_scan"] = _run(opscope + ["scan", NANOGPT, "--steps", str(SCAN_STEPS), "--out", work / "gpt2",
                                      "--format", "", "--", *GPT2_ARGS], logs / "gpt2_scan.txt", 400)
    if tests:   # the whole suite, its gpu tests included; in parallel where pytest-xdist is installed
        import importlib.util
        workers = ["-n", str(min(16, os.cpu_count() or 1))] if importlib.util.find_spec("xdist") else []
        rc["pytest"] = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "tests/"],
                            logs / "pytest.txt", 3600)
    (work / "gpu_check.json").write_text(json.dumps(rc, indent=1), encoding="utf-8")
    return rc


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return (head + ("+changes" if dirty else "")) or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def meta_of_runs(work: Path) -> dict:
    """Date and torch version of runs made before (``--from``): read from their scan.json."""
    for name in ("cnn", "gpt2"):
        if (work / name / "scan.json").exists():
            scan = load_json(work / name / "scan.json")
            return {"date": str(scan.get("started_at") or "?")[:10], "torch": scan.get("torch_version", "?"),
                    "commit": f"opscope {scan.get('tool_version', '?')}", "gpu": f"runs in {work}"}
    return {}


def write(text: str, out: Path | None) -> None:
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        before = out.read_text(encoding="utf-8") if out.exists() else ""
        out.write_text(before.rstrip("\n") + ("\n\n" if before else "") + text, encoding="utf-8")
        print(f"appended to {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="append the dated table to this Markdown file")
    ap.add_argument("--work", type=Path, help="keep the runs in this folder (default: a temporary one)")
    ap.add_argument("--from", dest="source", type=Path, help="build the table from runs made before; run nothing")
    ap.add_argument("--tests", action="store_true",
                    help="also run the test suite here (longer than the rest: minutes to tens of minutes)")
    args = ap.parse_args(argv)
    command = " ".join(["python bench/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])
    if args.source is not None:
        meta = dict(meta_of_runs(args.source), command=command)
        write(render(build_rows(args.source), meta), args.out)
        return 0
    gpu = gpu_name()
    if gpu is None:
        print("gpu_check: no CUDA GPU is visible here (torch.cuda.is_available() is False); nothing was run",
              file=sys.stderr)
        return NO_GPU
    import torch
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="opscope-gpu-check-") as tmp:
        work = args.work or Path(tmp)
        print(f"gpu_check: {gpu}, runs in {work}", file=sys.stderr)
        rc = run_all(work, tests=args.tests)
        rows = build_rows(work)
    meta = {"date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"), "commit": commit(), "gpu": gpu,
            "torch": f"{torch.__version__}, Python {platform.python_version()}", "command": command,
            "wall_s": time.monotonic() - start}
    write(render(rows, meta), args.out)
    failed = [k for k, v in rc.items() if v != 0 and k not in ("verify_rc", "pytest")]
    return RUN_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
