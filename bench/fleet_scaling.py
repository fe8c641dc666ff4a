"""How `opscope fleet` scales: the same 8 torchvision models sequentially and on Ray with 1 and 2 workers.

    python bench/fleet_scaling.py [--steps 3] [--image-size 64] [--nodes 16 --cores-per-node 16 --zoo-size 500]

Runs `opscope fleet --zoo torchvision --models M1..M8 --force` three times (``--engine serial``,
``--workers 1``, ``--workers 2``), prints each wall time and its ratio to the sequential run,
measures Ray's own cost per task (an empty task round trip and the local cluster's start),
and from those a paper estimate for a large zoo on a cluster:
``per-model cost x models / workers + Ray overhead per task x models / workers + start-up``.
Never part of the test suite (it takes minutes).  Needs Ray and torchvision (opscope[fleet]).
"""
from __future__ import annotations

import argparse
import json
import os
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
    args = p.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    print(f"{len(MODELS)} torchvision models, {args.steps} steps, {args.image_size}px, {os.cpu_count()} cores:")
    with tempfile.TemporaryDirectory() as tmp:
        serial = fleet(Path(tmp) / "serial", args.steps, args.image_size, ["--engine", "serial"])
        ray1 = fleet(Path(tmp) / "ray1", args.steps, args.image_size, ["--workers", "1"])
        ray2 = fleet(Path(tmp) / "ray2", args.steps, args.image_size, ["--workers", "2"])
    print(f"ratios to sequential: Ray 1 worker {ray1 / serial:.2f}x, Ray 2 workers {ray2 / serial:.2f}x "
          f"(speed-up {serial / ray2:.2f}x)")
    start, per_task = ray_overhead()
    per_model = serial / len(MODELS)
    workers = args.nodes * args.cores_per_node
    estimate = per_model * args.zoo_size / workers + per_task * args.zoo_size / workers + start
    print(f"Ray: local cluster start {start:.1f} s, {1000 * per_task:.1f} ms per empty task round trip")
    print(f"paper estimate, {args.zoo_size} models on {args.nodes} nodes x {args.cores_per_node} cores "
          f"({workers} one-CPU jobs at once): {per_model:.1f} s/model x {args.zoo_size} / {workers} "
          f"+ {1000 * per_task:.1f} ms x {args.zoo_size} / {workers} + {start:.1f} s start = "
          f"{estimate / 60:.1f} min")


if __name__ == "__main__":
    main()
