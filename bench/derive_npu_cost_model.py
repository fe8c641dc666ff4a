"""Recompute the `derived` figures of support_matrix/npu_cost_model.yaml from the real profiles.

    python bench/derive_npu_cost_model.py [--shared ../shared]

Per kernel type of the AlexNet (rank 0, level 1) and LLM (rank 0) kernel_details.csv:
cube kernels -> achieved fraction of the chip's cube peak (median over its launches, after
the floor); vector kernels -> achieved bandwidth (median bytes/(duration - floor) over
launches that move >= 1 MB), scaled to the reference chip's HBM; floors -> the smallest
launches.  Prints yaml-ready lines; the yaml is edited by hand from them (and says so).
"""
from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from opscope.analysis.npu.cost import cube_run, profile_kernels, resolve_chip
from opscope.parsers.ascend_kernels import read_kernel_details

# which chip each calibration run used: its cube Block Dim (24 / 20 AI cores) names it
RUNS = {
    "alexnet_l1": ("data/ascend_profiles/alexnet_ddp_2rank/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT",
                   "Ascend910B2"),
    "llm_r0": ("data/ascend_profiles/llm_megatron_4rank_level2/rank_0_ascend_pt/ASCEND_PROFILER_OUTPUT",
               "Ascend910B3"),
}


def fit_vector(items) -> tuple[float, float]:
    """(floor us, GB/s on the reference chip) minimising the time-weighted |log2(pred/measured)|."""
    shortest = min(dur for *_, dur in items)
    floors = [f for f in (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0, 30.0, 50.0) if f <= shortest] or [0.5]
    rates = [50 * 1.1 ** i for i in range(60)]
    best = (float("inf"), 1.5, 900.0)
    for f in floors:
        for g in rates:
            err = sum(dur * abs(math.log2((f + k.bytes / (g * chip["hbm_gbps"] / 1600 * 1e9) * 1e6) / dur))
                      for _, chip, k, dur in items)
            best = min(best, (err, f, g))
    return best[1], best[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[1].parent / "shared"))
    args = ap.parse_args()
    per_type: dict[str, list] = defaultdict(list)
    for run, (rel, chip_name) in RUNS.items():
        _, chip = resolve_chip(chip_name)
        rows = read_kernel_details(Path(args.shared) / rel / "kernel_details.csv")
        for row, kernel in zip(rows, profile_kernels(rows), strict=True):
            per_type[row.type].append((run, chip, kernel, row.duration_us))
    print(f"{'type':28} {'unit':6} {'n':>4} {'floor':>6} {'figure':>12}  runs")
    for ktype, items in sorted(per_type.items(), key=lambda kv: -sum(i[3] for i in kv[1])):
        unit = items[0][2].unit
        if unit == "comm":
            continue
        durations = sorted(i[3] for i in items)
        runs = ",".join(sorted({i[0] for i in items}))
        if unit in ("cube", "fa"):
            floor = 12.0 if unit == "cube" else 20.0
            by_run = {}
            for run, chip, k, dur in items:
                run_dtype, peak, _ = cube_run(k, chip)   # the dtype it ran in: fp32 convs run in HF32 on a 910B
                if k.flops and dur > floor:
                    by_run.setdefault(f"{run} {run_dtype}", []).append(k.flops / (peak * 1e12) / ((dur - floor) * 1e-6))
            figure = " ".join(f"{r}:{statistics.median(v):.3f}" for r, v in sorted(by_run.items()))
        elif len(items) >= 3 and any(k.bytes for _, _, k, _ in items):
            floor, gbps = fit_vector(items)
            figure = f"{gbps:.0f} GB/s"
        else:
            small = [dur for _, _, k, dur in items if k.bytes < 256e3]
            floor = min(small) if small else 1.5
            big = [(k, dur, chip) for _, chip, k, dur in items if k.bytes >= 1e6 and dur > floor + 0.5]
            if not big:
                big = [(k, dur, chip) for _, chip, k, dur in items if k.bytes and dur > floor + 0.5]
            bws = [k.bytes / ((dur - floor) * 1e-6) / 1e9 * 1600 / chip["hbm_gbps"] for k, dur, chip in big]
            figure = f"{statistics.median(bws):.0f} GB/s" if bws else "-"
        print(f"{ktype:28} {unit:6} {len(items):>4} {floor:>6.2f} {figure:>12}  {runs}  "
              f"total {sum(durations) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
