"""Scan overhead: the same training steps run plain, under `opscope scan`, and with the seed method.

    python bench/scan_overhead.py [--steps 20] [--repeat 3] [--script SCRIPT [-- ARGS]]
    python bench/scan_overhead.py --per-step [--steps 20] [--repeat 3] [--warmup-iters 5]

--per-step times one step instead of whole processes (issue 40 item 5): nanoGPT's train.py
(tests/data/scripts/frameworks/nanogpt_train.py) with 12 layers at tiny width on the CPU, where a step is bound
by its ~2,000 torch calls as a GPT-2 small step is on a GPU; with a GPU, GPT-2 small itself (b12 x 1024, bf16) on
the GPU.  Each run parses the script's own `iter N: ... time X ms` lines and takes the median (and the mean:
a step that writes what the profiler recorded counts there) of the iterations after --warmup-iters, for plain,
the bare profiler (record_shapes, CPU activity, + CUDA with a GPU, stopped once at the end) and `opscope scan`.

Without --script it runs the suite: examples/train_alexnet.py, examples/train_resnet50.py
(imagenet/main.py shape with a StepLR scheduler) and a nanoGPT-style trainer.

- plain: the script run for N optimizer steps with no profiler (stopped by the same global optimizer
  post-hook the scan uses, so LR schedulers keep working); on a
  machine without a GPU only opscope's CUDA->CPU remap is applied, so the script can run at all;
- opscope: `opscope scan SCRIPT --steps N` (capture, analysis, scan.json/operators.csv/traces; no
  HTML/XLSX so we time the scan itself);
- profiler: the bare profiler floor - `torch.profiler.profile(record_shapes=True)` across all N steps,
  stopped once at the end, nothing else (no source lines, no per-step output);
- profiler-steps (with --all): the same profiler stopped and started at every step boundary, each
  step's events read (what a per-step capture pays beyond the across-steps floor);
- profiler-record (with --all): the profiler across all steps with its events never read: the cost
  of recording alone (Kineto's per-operator callbacks), the floor under any reading of the events;
- seed: the porting guide's method - profile each step with record_shapes, print
  `key_averages(group_by_input_shape=True).table()` and parse the printed table.
Prints median wall seconds of whole processes (Python + torch start-up included) and the ratios, and
the median CPU seconds (user + system, the whole process tree): steadier than wall time on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNNER = r'''
import os, re, runpy, sys
mode, steps, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = [script] + sys.argv[4:]
import torch
state = {"n": 0, "prof": None, "rows": 0}
ROW = re.compile(r"^\s*(\S+)\s+.*?(\[\[.*\]\])?\s*$")

def start():
    if mode == "profiler-steps":   # the same profiler, stopped and started again at every step boundary
        from torch.profiler import ProfilerActivity, profile
        state["prof"] = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        state["prof"].__enter__()
    if mode in ("profiler", "profiler-record") and state["prof"] is None:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        state["prof"] = profile(activities=activities, record_shapes=True)
        state["prof"].__enter__()
    if mode == "seed":
        state["prof"] = torch.autograd.profiler.profile(record_shapes=True)
        state["prof"].__enter__()

def end_step():
    if mode == "profiler-steps":
        state["prof"].__exit__(None, None, None)
        state["rows"] += len(state["prof"].events())   # the same events parsed as the across-steps run
    if mode == "seed":
        prof = state["prof"]
        prof.__exit__(None, None, None)
        table = prof.key_averages(group_by_input_shape=True).table(row_limit=-1)
        print(table)
        ops = {}
        for line in table.splitlines()[3:-3]:  # the seed's parser: op name + input shapes per row
            m = ROW.match(line)
            if m:
                ops.setdefault(m.group(1), set()).add(m.group(2))
        state["rows"] += len(ops)

def after_step():
    state["n"] += 1
    end_step()
    if state["n"] >= steps:
        if mode == "profiler":
            state["prof"].__exit__(None, None, None)   # the profiler's own post-processing counts
            state["rows"] = len(state["prof"].events())
        if mode == "profiler-record":
            state["prof"].__exit__(None, None, None)   # recording only: the events are never read
        sys.stdout.flush()
        os._exit(0)
    start()

# Steps end with the same global optimizer hooks the scan uses (no wrapping of opt.step, which
# breaks LR schedulers).  The profiler is stopped at the next top-level module call, not inside
# the optimizer's own record_function range (stopping Kineto there crashes it).
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.nn.modules.module import register_module_forward_pre_hook
state["pending"] = False
state["depth"] = 0

def _post(opt, args, kwargs):
    if mode in ("seed", "profiler-steps"):
        state["pending"] = True
    else:
        after_step()

def _fwd_pre(module, args):
    if state["pending"]:
        state["pending"] = False
        after_step()

register_optimizer_step_post_hook(_post)
register_module_forward_pre_hook(_fwd_pre)
if not torch.cuda.is_available() and not os.environ.get("BENCH_NO_REMAP"):
    # a GPU script needs CUDA calls remapped to run here at all: apply only opscope's remap
    # (no profiler, no source tracking) so the baseline runs the same code path
    from torch.overrides import TorchFunctionMode
    from opscope.capture.remap import CudaRemapper, RuntimeFindings
    from opscope.capture.source import UserCode
    remap = CudaRemapper(RuntimeFindings(UserCode(os.path.dirname(os.path.abspath(script)))))
    remap.install()

    class RemapOnly(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            args, kwargs, handled, result = remap.on_call(func, args, kwargs or {})
            return result if handled else func(*args, **kwargs)

    RemapOnly().__enter__()
start()
runpy.run_path(script, run_name="__main__")
'''


CPU: dict[str, list[float]] = {}   # CPU seconds (user + sys of the whole process tree) per run, by command


def timed(cmd, env=None, name: str = "") -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(name, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                         f"{proc.stderr.decode()[-1500:]}")
    return elapsed


def main() -> None:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--script", default=None, help="one script (default: the suite below)")
    parser.add_argument("--all", action="store_true",
                        help="also the profiler stopped and started at every step boundary")
    parser.add_argument("--per-step", action="store_true",
                        help="median iteration ms of the nanoGPT case (the script's own 'time X ms' lines)")
    parser.add_argument("--warmup-iters", type=int, default=5, help="--per-step: iterations left out at the start")
    args = parser.parse_args(argv)
    if args.per_step:
        run_per_step(args, extra)
        return
    if args.script:
        suite = [(args.script, extra or ["--epochs", "1", "--samples", str(32 * (args.steps + 4)), "--amp"])]
    else:
        suite = SUITE(args.steps)
    for script, script_args in suite:
        run_one(args, str(script), script_args)


def has_gpu() -> bool:
    """Whether torch sees a GPU here (asked in a child process: this one never imports torch)."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, cwd=ROOT)
    return probe.stdout.strip().endswith("True")


def scan_env() -> dict:
    """The environment of every run: the GPU hidden only where there is none (then the CUDA stand-in runs)."""
    if has_gpu():
        return dict(os.environ)
    return dict(os.environ, CUDA_VISIBLE_DEVICES="")


NANOGPT = ROOT / "tests" / "data" / "scripts" / "frameworks" / "nanogpt_train.py"
# issue 40 item 5: 12 layers at tiny width on the CPU (a step bound by its torch calls, as GPT-2 small's on a GPU)
NANOGPT_CPU = ["--n_layer=12", "--n_head=12", "--n_embd=48", "--block_size=32", "--batch_size=2", "--dropout=0.0",
               "--compile=False", "--device=cpu", "--dtype=float32", "--eval_interval=1000"]
# GPT-2 small as the issue timed it on the H200 (b12 x 1024, bf16)
NANOGPT_GPU = ["--n_layer=12", "--n_head=12", "--n_embd=768", "--block_size=1024", "--batch_size=12",
               "--dropout=0.0", "--compile=False", "--device=cuda", "--dtype=bfloat16", "--eval_interval=1000"]
ITER_TIME = re.compile(r"^iter \d+:.*\btime ([\d.]+) ?ms", re.M)


def run_per_step(args, extra: list) -> None:
    """Per-step ms of plain, bare profiler and `opscope scan`, runs interleaved, medians over runs."""
    gpu = has_gpu()
    # the script is told its device: no CUDA stand-in in the profiler's run (its TorchFunctionMode costs time)
    env = dict(os.environ, BENCH_NO_REMAP="1") if gpu else dict(os.environ, CUDA_VISIBLE_DEVICES="", BENCH_NO_REMAP="1")
    script = args.script or str(NANOGPT)
    iters = args.steps + args.warmup_iters + 2
    script_args = extra or [*(NANOGPT_GPU if gpu else NANOGPT_CPU), f"--max_iters={iters}"]
    with tempfile.TemporaryDirectory() as tmp:
        runner = Path(tmp) / "runner.py"
        runner.write_text(RUNNER)
        commands = {
            "plain": [sys.executable, script, *script_args],
            # stopped once at the end, its events never read (reading them as FunctionEvents takes longer than
            # the run): its process time is recording plus one stop
            "profiler": [sys.executable, str(runner), "profiler-record", str(iters), script, *script_args],
            "opscope": [sys.executable, "-m", "opscope", "scan", script, "--steps", str(iters), "--out",
                        str(Path(tmp) / "run"), "--format", "", "--quiet", "--", *script_args],
        }
        median: dict[str, list[float]] = {name: [] for name in commands}
        mean: dict[str, list[float]] = {name: [] for name in commands}
        wall: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):   # interleaved: machine noise hits every mode alike
            for name, cmd in commands.items():
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
                wall[name].append(time.perf_counter() - t0)
                times = [float(t) for t in ITER_TIME.findall(proc.stdout)][args.warmup_iters:]
                if proc.returncode != 0 or not times:
                    raise SystemExit(f"{name} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-1500:]}")
                median[name].append(statistics.median(times))
                mean[name].append(statistics.fmean(times))
    print(f"script: {os.path.relpath(script, ROOT)} {' '.join(script_args)}; {'GPU' if gpu else 'CPU, no GPU'}; "
          f"iterations {args.warmup_iters + 1}-{iters} of each run; repeat: {args.repeat} (median over runs)")
    med = {name: statistics.median(v) for name, v in median.items()}
    avg = {name: statistics.median(v) for name, v in mean.items()}
    print(f"{'run':<10}{'median ms/iter':>16}{'vs plain':>10}{'vs profiler':>13}{'mean ms/iter':>14}"
          f"{'vs profiler':>13}{'process s':>11}")
    for name in commands:
        print(f"{name:<10}{med[name]:>16.1f}{med[name] / med['plain']:>9.2f}x{med[name] / med['profiler']:>12.2f}x"
              f"{avg[name]:>14.1f}{avg[name] / avg['profiler']:>12.2f}x{statistics.median(wall[name]):>11.2f}")
    # what the iterations do not show: the steps one profiler session recorded are written after it stops (at
    # the scan's last step, here), and start-up and analysis; all in, per captured step
    extra_s = statistics.median(wall["opscope"]) - statistics.median(wall["plain"])
    print(f"opscope's whole run: {extra_s:+.2f} s over plain, {extra_s / iters * 1000:.0f} ms per captured step "
          f"(start-up, the steps' writing and the analysis included)")


def SUITE(steps: int) -> list:
    """Real training scripts: ImageNet AlexNet and ResNet-50 (imagenet/main.py shape, LR scheduler),
    a nanoGPT-style trainer (AdamW, autocast, GradScaler, grad accumulation, periodic eval)."""
    n = 8 * (steps + 4)
    return [
        (ROOT / "examples" / "train_alexnet.py", ["--dummy", "-b", "8", "--image-size", "128", "--samples", str(n)]),
        (ROOT / "examples" / "train_resnet50.py", ["--dummy", "-b", "8", "--image-size", "64", "--samples", str(n)]),
        (ROOT / "tests" / "data" / "scripts" / "nanogpt_style.py", ["--compile", "0", "--max_iters", str(steps + 4)]),
    ]


def run_one(args, script: str, script_args: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runner = Path(tmp) / "runner.py"
        runner.write_text(RUNNER)
        env = scan_env()
        commands = {
            "plain": [sys.executable, str(runner), "plain", str(args.steps), script, *script_args],
            "opscope": [sys.executable, "-m", "opscope", "scan", script, "--steps", str(args.steps),
                        "--out", str(Path(tmp) / "run"), "--format", "", "--quiet", "--", *script_args],
            "profiler": [sys.executable, str(runner), "profiler", str(args.steps), script, *script_args],
            "seed": [sys.executable, str(runner), "seed", str(args.steps), script, *script_args],
        }
        envs = {name: env for name in commands}
        if args.all:
            commands["profiler-steps"] = [sys.executable, str(runner), "profiler-steps", str(args.steps), script,
                                          *script_args]
            envs["profiler-steps"] = env
            commands["profiler-record"] = [sys.executable, str(runner), "profiler-record", str(args.steps), script,
                                           *script_args]
            envs["profiler-record"] = env
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):  # interleave runs so machine noise hits all of them alike
            for name, cmd in commands.items():
                times[name].append(timed(cmd, envs[name], name))
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"script: {os.path.relpath(script, ROOT)} {' '.join(script_args)}; steps: {args.steps}; "
          f"repeat: {args.repeat} (median wall seconds, whole process)")
    cpu = {name: statistics.median(CPU.pop(name)) for name in commands}
    print(f"{'run':<16}{'seconds':>10}{'vs plain':>10}{'CPU s':>10}{'vs plain':>10}")
    for name in [n for n in ("plain", "opscope", "profiler", "profiler-steps", "profiler-record", "seed")
                 if n in med]:
        print(f"{name:<16}{med[name]:>10.2f}{med[name] / med['plain']:>9.2f}x"
              f"{cpu[name]:>10.2f}{cpu[name] / cpu['plain']:>9.2f}x")
    print(f"opscope vs bare profiler: {med['opscope'] / med['profiler']:.2f}x; "
          f"vs seed method: {med['opscope'] / med['seed']:.2f}x")


if __name__ == "__main__":
    main()
