"""Does the NPU estimate's vector pricing depend on kernel size?  (#33 class 6, an L2-aware rate; not a timed test)

    python bench/vector_size_bias.py [--shared ../shared]

Every vector kernel of the shared profiles (LLM ranks 0 and 2 on Ascend910B3, AlexNet rank 0 on Ascend910B2),
priced from its own type, shapes and dtypes (``kernel_from_row`` + ``kernel_time_us``, as
bench/npu_estimate_accuracy.py does), grouped by the bytes it moves: the median log2(predicted / measured) per band.
A rate that ignores an L2 cache would over-predict the bands that fit in it (a positive median there).
"""
from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = [("LLM rank 0 (fitted)", "data/ascend_profiles/llm_megatron_4rank_level2/rank_0_ascend_pt", "Ascend910B3"),
            ("LLM rank 2 (held out)", "data/ascend_profiles/llm_megatron_4rank_level2/rank_2_ascend_pt", "Ascend910B3"),
            ("AlexNet rank 0 (fitted)", "data/ascend_profiles/alexnet_ddp_2rank/text/level1/rank0_ascend_pt",
             "Ascend910B2")]
BANDS = [(0, 1e6, "< 1 MB"), (1e6, 8e6, "1-8 MB"), (8e6, 64e6, "8-64 MB"), (64e6, 192e6, "64-192 MB"),
         (192e6, float("inf"), "> 192 MB")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = ap.parse_args()
    from opscope.analysis.npu_cost import kernel_from_row, kernel_time_us, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    print(f"{'profile':26s}{'band':>11s}{'kernels':>9s}{'median log2(pred/meas)':>25s}{'measured ms':>13s}")
    for label, folder, chip_name in PROFILES:
        _, chip = resolve_chip(chip_name)
        path = Path(args.shared) / folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
        bands: dict[str, list[tuple[float, float]]] = {}
        for row in read_kernel_details(path):
            kernel = kernel_from_row(row)
            if kernel.unit != "vector" or kernel.type == "TransData" or row.duration_us <= 0:
                continue
            name = next(n for lo, hi, n in BANDS if lo <= kernel.bytes < hi)
            bands.setdefault(name, []).append((math.log2(kernel_time_us(kernel, chip) / row.duration_us),
                                               row.duration_us))
        for _, _, name in BANDS:
            values = bands.get(name) or []
            if values:
                print(f"{label:26s}{name:>11s}{len(values):9d}{statistics.median(v for v, _ in values):25.2f}"
                      f"{sum(t for _, t in values) / 1000:13.1f}")


if __name__ == "__main__":
    main()
