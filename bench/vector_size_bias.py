"""Does the NPU estimate's vector pricing depend on kernel size?  (#33 class 6, an L2-aware rate; not a timed test)

    python bench/vector_size_bias.py [--shared ../shared]

Every vector kernel of the shared profiles (LLM ranks 0 and 2 on Ascend910B3, AlexNet rank 0 on Ascend910B2),
priced from its own type, shapes and dtypes (``kernel_from_row`` + ``kernel_time_us``, as
bench/npu_estimate_accuracy.py does), grouped by the bytes it moves: the median log2(predicted / measured) per band.
A rate that ignores an L2 cache would over-predict the bands that fit in it (a positive median there).

Second table (the L2 rule of npu_cost_model.yaml ``l2``): type for type, the achieved GB/s of 1-192 MB vector
kernels whose input the kernel just before wrote (a producer -> consumer chain: is that input served from L2?)
against those whose input it did not, and how many kernels re-ran the kernel before them (priced from L2).
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
    from opscope.analysis.npu.cost import kernel_time_us, profile_kernels, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    print(f"{'profile':26s}{'band':>11s}{'kernels':>9s}{'median log2(pred/meas)':>25s}{'measured ms':>13s}")
    for label, folder, chip_name in PROFILES:
        _, chip = resolve_chip(chip_name)
        path = Path(args.shared) / folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
        bands: dict[str, list[tuple[float, float]]] = {}
        rows = read_kernel_details(path)
        for row, kernel in zip(rows, profile_kernels(rows), strict=True):
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

    chains(args.shared)


def chains(shared: str) -> None:
    """Type for type: GB/s of vector kernels that read what the kernel before wrote, against the others."""
    from opscope.analysis.npu.cost import profile_kernels
    from opscope.parsers.ascend_kernels import read_kernel_details
    print(f"\n{'profile':26s}{'type':>10s}{'chained':>9s}{'GB/s':>7s}{'other':>7s}{'GB/s':>7s}{'ratio':>7s}"
          f"{'re-runs':>9s}")
    for label, folder, _ in PROFILES:
        rows = read_kernel_details(Path(shared) / folder / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
        kernels = profile_kernels(rows)
        rates: dict[str, dict[bool, list[float]]] = {}
        written_before: set = set()
        for row, kernel in zip(rows, kernels, strict=True):
            outputs = {(str(s), d) for s, d in zip(row.output_shapes, row.output_dtypes, strict=False)}
            if kernel.unit == "vector" and kernel.type != "TransData" and 1e6 <= kernel.bytes < 192e6 \
                    and row.duration_us > 0:
                chained = any((str(s), d) in written_before
                              for s, d in zip(row.input_shapes, row.input_dtypes, strict=False))
                rates.setdefault(kernel.type, {True: [], False: []})[chained].append(
                    kernel.bytes / row.duration_us / 1e3)
            written_before = outputs
        reruns = sum(1 for k in kernels if k.warm)
        for ktype, by in sorted(rates.items(), key=lambda kv: -len(kv[1][True])):
            if len(by[True]) >= 3 and len(by[False]) >= 3:
                a, b = statistics.median(by[True]), statistics.median(by[False])
                print(f"{label:26s}{ktype:>10s}{len(by[True]):9d}{a:7.0f}{len(by[False]):7d}{b:7.0f}{a / b:7.2f}"
                      f"{reruns:9d}")


if __name__ == "__main__":
    main()
