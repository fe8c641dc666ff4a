"""Does the stand-in record what the GPU runs?  The same scripts scanned on a real CUDA GPU and on the stand-in
(the same machine with the GPU hidden, so CUDA calls run on the CPU), compared operator for operator.

    python bench/gpu_parity.py [--work DIR] [--only resnet50,llama] [--out docs/measured/gpu-parity.md]
    python bench/gpu_parity.py --compare GPU_RUN STAND_IN_RUN    # two scan folders made before (no GPU needed)

Scripts (real sizes): ResNet-50 at batch 64, 224 px, SGD with momentum, 3 steps (`examples/train_resnet50.py
--dummy`); a Llama (hidden 512, 6 layers, batch 8 x 512) trained with the Hugging Face Trainer, 4 steps
(`bench/scripts/llama_trainer.py`, needs transformers); nanoGPT (`tests/data/scripts/frameworks/nanogpt_train.py`,
its small default GPT with fused AdamW) and the bundled CNN (AMP, cuDNN batch norm).

Per script one table row: whether every step was recorded whole on each side, the Jaccard index of the top-level
training operators (forward, backward, optimizer; steps after the first; a backend's own kernel counted as the
public op it implements, ``support_matrix/backend_private_ops.yaml``; the host's data work left out), whether the
optimizer kernels (``_foreach_*``, ``_fused_*``) are the same, and the operators only one side ran.  The acceptance
bar is Jaccard >= 0.95 with every step whole.

Exit status: 0 every script met the bar; 1 a scan failed or a script missed it; 3 no CUDA GPU is visible here.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / "tests" / "data" / "scripts" / "frameworks"
TRAINING = ("forward", "backward", "optimizer")
BAR = 0.95
NO_GPU = 3
MISSED = 1
LLAMA_ARGS = ["--hidden", "512", "--layers", "6", "--seq", "512", "--per_device_train_batch_size", "8",
              "--report_to", "none", "--save_strategy", "no"]


@dataclass
class Script:
    """One script of the comparison: what to scan, for how many steps, with which arguments."""
    name: str
    path: Path
    steps: int
    args: list[str] = field(default_factory=list)
    needs: str | None = None   # a module the script imports that the machine may lack


SCRIPTS = [
    Script("resnet50", ROOT / "examples" / "train_resnet50.py", 3, ["--dummy", "-b", "64", "--samples", "256"]),
    Script("llama", ROOT / "bench" / "scripts" / "llama_trainer.py", 4, LLAMA_ARGS + ["--max_steps", "6"], "transformers"),
    Script("nanogpt", FRAMEWORKS / "nanogpt_train.py", 3, ["--max_iters=10", "--compile=False"]),
    Script("cnn", ROOT / "examples" / "train_cnn.py", 3, ["--epochs", "1", "--samples", "256"]),
]


def top_level(calls, first: int = 2) -> dict[str, set[str]]:
    """The top-level operator names per phase of each step from ``first`` on (the first step warms up), from a
    capture's calls (``opscope.capture.store.load_capture``: the capture's own reader)."""
    out: dict[str, set[str]] = {}
    for call in calls:
        if call.parent is None and call.step >= first:
            out.setdefault(call.phase, set()).add(call.name)
    return out


def public_op(name: str) -> str:
    """A backend's own kernel as the public op it implements (cuDNN's SDPA or batch norm, the CPU's fused SDPA):
    what either device runs, named alike; any other operator as it is."""
    from opscope.knowledge import backend_kernel
    entry = backend_kernel(name)
    if not entry:
        return name
    op = entry["op"]
    return f"{op}_backward" if entry["part"] == "backward" and not op.endswith("_backward") else op


def training_ops(phases: dict[str, set[str]], data: set[str], script_only: set[str] = frozenset()) -> set[str]:
    """Top-level operators of the training phases, backend kernels as their public op, without the host's data
    work (``data``: what either scan ran in its data phase, ``other``: the GPU's scan puts the batch's copy to the
    device there, the stand-in its no-op copy in the forward) and ``script_only`` (what the scripts differ in)."""
    names = {n for phase in TRAINING for n in phases.get(phase, ())} - data - set(script_only)
    return {public_op(n) for n in names}


def optimizer_kernels(phases: dict[str, set[str]]) -> set[str]:
    return {n for n in phases.get("optimizer", ()) if n.startswith(("aten::_foreach_", "aten::_fused_"))}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


@dataclass
class Parity:
    """One script's comparison (``compare``)."""
    name: str
    jaccard: float
    gpu_whole: bool
    stand_in_whole: bool
    same_optimizer: bool
    optimizer: list[str]
    gpu_only: list[str]
    stand_in_only: list[str]
    error: str | None = None

    @property
    def met(self) -> bool:
        return self.error is None and self.gpu_whole and self.stand_in_whole and self.jaccard >= BAR


def _whole(steps) -> bool:
    """Every step ran to its end and was recorded whole (none cut by the capture's budget)."""
    return bool(steps) and all(s.complete and not s.unrecorded.get("after_calls") for s in steps)


def compare(name: str, gpu_run: Path, stand_in_run: Path) -> Parity:
    """The stand-in's top-level training operators against the GPU's, from two run folders of one script."""
    from opscope.capture.store import load_capture
    theirs_capture, mine_capture = load_capture(gpu_run), load_capture(stand_in_run)
    gpu, mine = top_level(theirs_capture.calls), top_level(mine_capture.calls)
    data = gpu.get("other", set()) | mine.get("other", set())
    theirs, ours = training_ops(gpu, data), training_ops(mine, data)
    return Parity(name, round(jaccard(theirs, ours), 3), _whole(theirs_capture.steps), _whole(mine_capture.steps),
                  optimizer_kernels(gpu) == optimizer_kernels(mine), sorted(optimizer_kernels(gpu)),
                  sorted(theirs - ours), sorted(ours - theirs))


def _scan(script: Script, out: Path, gpu: bool, log: Path, environ: dict | None = None) -> int:
    env = dict(os.environ if environ is None else environ, PYTHONUNBUFFERED="1")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""   # the stand-in: CUDA calls run on the CPU
    cmd = [sys.executable, "-m", "opscope", "scan", str(script.path), "--steps", str(script.steps), "--out", str(out),
           "--format", "", "--quiet"] + (["--device", "cuda"] if gpu else []) + ["--", *script.args]
    with tempfile.TemporaryDirectory(prefix="opscope-parity-") as cwd:   # the Trainer writes its output_dir here
        proc = subprocess.run(cmd + (["--output_dir", cwd] if script.name == "llama" else []), cwd=cwd,
                              capture_output=True, text=True, env=env, timeout=1800)
    log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
    return proc.returncode


def run_script(script: Script, work: Path, environ: dict | None = None) -> Parity:
    """Scan ``script`` on the GPU and on the stand-in into ``work`` and compare the two (``environ``: the
    environment that sees the GPU, default this process's)."""
    runs = {}
    for side, gpu in (("gpu", True), ("stand-in", False)):
        run = work.resolve() / f"{script.name}-{side}"   # the scan runs in a temporary folder
        rc = _scan(script, run, gpu, work.resolve() / f"{script.name}-{side}.log", environ)
        if not (run / "capture" / "steps.jsonl").exists():
            return Parity(script.name, 0.0, False, False, False, [], [], [],
                          error=f"{side} scan exited {rc} with no capture (see {script.name}-{side}.log)")
        runs[side] = run
    return compare(script.name, runs["gpu"], runs["stand-in"])


def render(rows: list[Parity], meta: dict) -> str:
    """The Markdown table, one row per script."""
    head = ", ".join(f"{k} {v}" for k, v in meta.items())
    out = [f"Stand-in vs GPU, top-level training operators ({head}); bar: Jaccard >= {BAR} with every step whole.", "",
           "| script | Jaccard | steps whole (GPU / stand-in) | optimizer kernels | only on the GPU | only on the stand-in "
           "| met |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error:
            out.append(f"| {r.name} | - | - | - | - | - | no: {r.error} |")
            continue
        opt = ("same: " if r.same_optimizer else "differ; GPU: ") + (", ".join(r.optimizer) or "none")
        out.append(f"| {r.name} | {r.jaccard:.3f} | {'yes' if r.gpu_whole else 'NO'} / "
                   f"{'yes' if r.stand_in_whole else 'NO'} | {opt} | {', '.join(r.gpu_only) or '-'} | "
                   f"{', '.join(r.stand_in_only) or '-'} | {'yes' if r.met else 'no'} |")
    return "\n".join(out) + "\n"


def _meta() -> dict:
    import platform

    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"torch": torch.__version__, "GPU": gpu, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--only", help="comma-separated script names: " + ", ".join(s.name for s in SCRIPTS))
    ap.add_argument("--out", help="append the table to this Markdown file")
    ap.add_argument("--compare", nargs=2, metavar=("GPU_RUN", "STAND_IN_RUN"), help="compare two run folders")
    args = ap.parse_args(argv)
    if args.compare:
        rows = [compare(Path(args.compare[0]).name, *map(Path, args.compare))]
    else:
        import importlib.util

        import torch
        if not torch.cuda.is_available():
            print("gpu_parity: no CUDA GPU is visible here; run it on a GPU machine, or --compare two runs",
                  file=sys.stderr)
            return NO_GPU
        wanted = set(args.only.split(",")) if args.only else {s.name for s in SCRIPTS}
        unknown = wanted - {s.name for s in SCRIPTS}
        if unknown:
            ap.error(f"--only: no script named {', '.join(sorted(unknown))} (known: "
                     + ", ".join(s.name for s in SCRIPTS) + ")")
        work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="opscope-parity-"))
        work.mkdir(parents=True, exist_ok=True)
        rows = []
        for script in SCRIPTS:
            if script.name not in wanted:
                continue
            if script.needs and importlib.util.find_spec(script.needs) is None:
                rows.append(Parity(script.name, 0.0, False, False, False, [], [], [], error=f"{script.needs} absent"))
                continue
            print(f"gpu_parity: {script.name}", file=sys.stderr)
            rows.append(run_script(script, work))
    text = render(rows, _meta())
    print(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write("\n" + text)
    return 0 if all(r.met for r in rows) else MISSED


if __name__ == "__main__":
    sys.exit(main())
