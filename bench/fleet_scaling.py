"""How `opscope fleet` scales: the same 8 torchvision models sequentially and on Ray with 1 and 2 workers.

    python bench/fleet_scaling.py [--steps 3] [--image-size 64] [--nodes 16 --cores-per-node 16 --zoo-size 500]

Runs `opscope fleet --zoo torchvision --models M1..M8 --force` three times (``--engine serial``,
``--workers 1``, ``--workers 2``), prints each wall time and its ratio to the sequential run,
measures Ray's own cost per task (an empty task round trip and the local cluster's start),
and from those a paper estimate for a large zoo on a cluster:
``ceil(models / workers) x (per-model cost + Ray overhead per task) + cluster start``.
``--repeat N`` interleaves the three runs N times and reports medians (the machine is shared).
Never part of the test suite (it takes minutes).  Needs Ray and torchvision (opscope[fleet]).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["resnet18", "mobilenet_v3_small", "mobilenet_v2", "squeezenet1_1", "shufflenet_v2_x0_5",
          "mnasnet0_5", "efficientnet_b0", "regnet_x_400mf"]


def fleet(out: Path, steps: int, size: int, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "opscope", "fleet", "--zoo", "torchvision", "--models", ",".join(MODELS),
           "--steps", str(steps), "--image-size", str(size), "--targets", "2.14", "--force", "--quiet",
           "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"fleet run failed ({' '.join(extra)}): {proc.stderr[-2000:]}")
    doc = json.loads((out / "fleet.json").read_text())
    per_job = sorted(j["duration_s"] for j in doc["jobs"])
    print(f"  {' '.join(extra):<22} {wall:7.1f} s  (job median {per_job[len(per_job) // 2]:.1f} s)", flush=True)
    return wall


def ray_overhead(tasks: int = 20) -> tuple[float, float]:
    """(seconds to start the local cluster, seconds per empty task round trip with num_cpus=1)."""
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 1024 * 1024)
    start = time.perf_counter() - t0

    @ray.remote(num_cpus=1)
    def noop(i):
        return i

    ray.get(noop.remote(-1))          # the first task starts a worker process
    t0 = time.perf_counter()
    for i in range(tasks):
        ray.get(noop.remote(i))
    per_task = (time.perf_counter() - t0) / tasks
    ray.shutdown()
    return start, per_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--zoo-size", type=int, default=500)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--cores-per-node", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    print(f"{len(MODELS)} torchvision models, {args.steps} steps, {args.image_size}px, {os.cpu_count()} cores:")
    modes = {"sequential": ["--engine", "serial"], "ray 1 worker": ["--workers", "1"],
             "ray 2 workers": ["--workers", "2"]}
    walls: dict = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for mode, extra in modes.items():
                walls[mode].append(fleet(Path(tmp) / f"{mode}-{r}".replace(" ", "_"), args.steps,
                                         args.image_size, extra))
    med = {m: statistics.median(v) for m, v in walls.items()}
    serial, ray1, ray2 = med["sequential"], med["ray 1 worker"], med["ray 2 workers"]
    print(f"medians: sequential {serial:.1f} s, Ray 1 worker {ray1:.1f} s, Ray 2 workers {ray2:.1f} s")
    print(f"ratios to sequential: Ray 1 worker {ray1 / serial:.2f}x, Ray 2 workers {ray2 / serial:.2f}x "
          f"(speed-up {serial / ray2:.2f}x)")
    start, per_task = ray_overhead()
    per_model = serial / len(MODELS)
    workers = args.nodes * args.cores_per_node
    waves = math.ceil(args.zoo_size / workers)
    estimate = waves * (per_model + per_task) + start
    print(f"Ray: local cluster start {start:.1f} s, {1000 * per_task:.1f} ms per empty task round trip; "
          f"Ray 1 worker vs sequential: {(ray1 - serial) / len(MODELS):+.1f} s per job")
    print(f"paper estimate, {args.zoo_size} models on {args.nodes} nodes x {args.cores_per_node} cores "
          f"({workers} one-CPU jobs at once): ceil({args.zoo_size}/{workers}) = {waves} wave(s) x "
          f"({per_model:.1f} s/model + {1000 * per_task:.1f} ms Ray) + {start:.1f} s start = {estimate / 60:.1f} min "
          "(for models as small as these; scale the per-model cost for bigger ones)")

if __name__ == "__main__":
    main()
