"""`opscope scan --mode fake` on a full-size LLM: wall time and peak RSS of the whole process tree.

    python bench/fake_scan.py [--steps 3] [--skip-7b]

- Llama-2-7B configuration (bench/scripts/llama_train.py defaults: 32 layers, d 4096, FFN 11008,
  vocab 32000, seq 4096 with batches padded to the longest, batch 1, bf16 autocast, AdamW):
  `opscope scan --mode fake --steps 3`.  Acceptance: < 120 s wall and < 3 GB peak RSS (the sum over
  every process of the scan: opscope, its capture child, anything they start), sampled every 0.2 s.
- The same configuration as a transformers `LlamaForCausalLM(LlamaConfig(...))` (no weights) trained with a
  plain loop (tests/data/scripts/hf_llama_tiny.py with 7B arguments), when transformers is installed (a
  sitecustomize gives torchvision opscope's CPU nms so that transformers imports next to the CPU torch).
- GPT-2 XL in a nanoGPT-style trainer (bench/scripts/gpt2_train.py defaults: 48 layers, d 1600, block 1024,
  batch 12, 2 micro-batches of gradient accumulation, bf16 autocast, GradScaler, AdamW), fake, 3 steps.
- The Llama script at a 2-layer, d 256 configuration scanned real and fake (the ratio of wall times).
Prints one line per run and a JSON summary.  Not a timed test: the figures depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "scripts" / "llama_train.py"
GPT2 = ROOT / "bench" / "scripts" / "gpt2_train.py"
SMALL = ["--layers", "2", "--dim", "256", "--heads", "4", "--hidden", "688", "--vocab", "1000", "--seq", "256"]


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * page
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total / 2**20


HF_SCRIPT = ROOT / "tests" / "data" / "scripts" / "hf_llama_tiny.py"
HF_7B = ["--layers", "32", "--hidden", "4096", "--intermediate", "11008", "--heads", "32", "--vocab", "32000",
         "--seq", "4096", "--batch-size", "1"]
SITE = ("try:\n    from opscope.fleet.tv_compat import import_torchvision\n    import_torchvision()\n"
        "except Exception:\n    pass\n")


def scan(mode: str, steps: int, argv: list[str], script: Path = SCRIPT, env: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="opscope-fake-bench-") as out:
        cmd = [sys.executable, "-m", "opscope", "scan", str(script), "--mode", mode, "--steps", str(steps),
               "--out", out, "--format", "", "-q", "--", *argv]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        peak = [0.0]

        def sample():
            while proc.poll() is None:
                peak[0] = max(peak[0], tree_rss_mb(proc.pid))
                time.sleep(0.2)

        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
        _, err = proc.communicate()
        wall = time.perf_counter() - t0
        watcher.join()
        if proc.returncode != 0:
            raise SystemExit(f"scan failed ({proc.returncode}): {err[-2000:]}")
        result = json.loads((Path(out) / "scan.json").read_text())
    fit = result.get("memory_fit") or {}
    return {"mode": mode, "wall_s": round(wall, 1), "peak_rss_mb": round(peak[0]), "operators": len(result["operators"]),
            "root_causes": [r["source"] for r in result["root_causes"]],
            "peak_gib": round(fit.get("peak_bytes", 0) / 2**30, 1) if fit else None,
            "fits_one_card": fit.get("fits_one_card"), "cards": {k: v["cards"] for k, v in (fit.get("cards") or {}).items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip-7b", action="store_true")
    args = p.parse_args()
    runs = {}
    if not args.skip_7b:
        runs["llama2_7b_fake"] = scan("fake", args.steps, [])
        print("Llama-2-7B fake:", runs["llama2_7b_fake"], flush=True)
        import importlib.util
        if importlib.util.find_spec("transformers") is not None:
            with tempfile.TemporaryDirectory(prefix="opscope-site-") as site:
                (Path(site) / "sitecustomize.py").write_text(SITE)
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    p for p in (site, os.environ.get("PYTHONPATH")) if p))
                runs["llama2_7b_transformers_fake"] = scan("fake", args.steps, HF_7B, HF_SCRIPT, env)
            print("Llama-2-7B (transformers) fake:", runs["llama2_7b_transformers_fake"], flush=True)
        runs["gpt2_xl_fake"] = scan("fake", args.steps, [], GPT2)
        print("GPT-2 XL fake:", runs["gpt2_xl_fake"], flush=True)
    runs["small_real"] = scan("real", args.steps, SMALL)
    runs["small_fake"] = scan("fake", args.steps, SMALL)
    runs["small_fake_over_real"] = round(runs["small_fake"]["wall_s"] / runs["small_real"]["wall_s"], 2)
    print("2-layer real:", runs["small_real"])
    print("2-layer fake:", runs["small_fake"], "fake/real wall", runs["small_fake_over_real"])
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
