"""How close opscope's NPU estimate comes to real Ascend profiles (not a timed test).

    python bench/npu_estimate_accuracy.py [--run RUN_DIR] [--shared ../shared]

(a) AlexNet batch 32, 224 px: scans examples/train_alexnet.py on this CPU (or reads
    --run, a folder of such a scan) and compares the estimate on the chip of the shared
    run (24 AI cores: Ascend910B2) with the shared AlexNet NPU run, rank 0, level 1:
    share of kernel time per kernel family, TransData share, computing time per step
    (step_trace_time.csv "Computing"), and what bounds the step (2 devices, as measured).
(b) Every kernel of the shared LLM profile's kernel_details.csv (ranks 0 and 2; rank 0
    was used to fit the cost model, rank 2 was not), predicted from its type, shapes and
    dtypes alone on the chip of that run (20 AI cores: Ascend910B3): the share of kernel
    time predicted within 2x and the median |log2(predicted / measured)|.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALEXNET = "data/ascend_profiles/alexnet_ddp_2rank/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT"
LLM = "data/ascend_profiles/llm_megatron_4rank_level2/rank_{}_ascend_pt/ASCEND_PROFILER_OUTPUT"
FAMILIES = {"conv+matmul": ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMulV2", "MatMulV3",
                            "BatchMatMul", "BatchMatMulV2"),
            "TransData": ("TransData",), "optimizer (foreach)": ("ForeachAddList", "ForeachMulScalar"),
            "pooling": ("MaxPoolWithArgmaxV1", "MaxPoolGradWithArgmaxV1", "AdaptiveAvgPool3d", "AdaptiveAvgPool3dGrad")}


def family_shares(times: dict[str, float], total: float | None = None) -> dict[str, float]:
    """Each family's share of ``total`` (default: the sum of ``times``)."""
    total = total or sum(times.values()) or 1.0
    return {fam: sum(v for k, v in times.items() if k in types) / total for fam, types in FAMILIES.items()}


def scan_alexnet(out: Path) -> None:
    cmd = [sys.executable, "-m", "opscope", "scan", str(ROOT / "examples/train_alexnet.py"), "--steps", "3",
           "-o", str(out), "-q", "--format", "json", "--", "--dummy", "-b", "32", "--image-size", "224",
           "--samples", "128"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def cost_of_estimate(run: Path, result) -> tuple[float, float, float]:
    """Seconds (best of 5) of the estimate alone, of building the scan result (which includes it) and of
    the scan's whole analysis step (``analyse_capture``: result + scan.json + report.html/.xlsx)."""
    import shutil
    import time
    from types import SimpleNamespace

    from opscope.analysis.npu_estimate import estimate
    from opscope.analysis.scan_result import build_scan_result
    from opscope.capture.store import load_capture
    from opscope.pipeline import analyse_capture
    outcome = SimpleNamespace(kind="finished", code=0, message="", where=None)
    fields = dict(script=result.script, argv=result.argv, device="cpu", settings=result.settings, outcome=outcome,
                  started_at="", duration_s=0.0)
    work = Path(tempfile.mkdtemp(prefix="opscope-cost-"))
    shutil.copytree(run / "capture", work / "capture")
    est, build, full = [], [], []
    for _ in range(5):
        capture = load_capture(run)
        t0 = time.perf_counter()
        estimate(result.operators, result.steps, capture[0], "Ascend910B2")
        est.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        build_scan_result(capture=capture, **fields)
        build.append(time.perf_counter() - t0)
        capture = load_capture(run)
        t0 = time.perf_counter()
        analyse_capture(work, capture=capture, formats=("html", "xlsx"), **fields)
        full.append(time.perf_counter() - t0)
    return min(est), min(build), min(full)


def alexnet(shared: Path, run: Path | None) -> dict:
    from opscope.analysis.npu_estimate import price
    from opscope.parsers.ascend_kernels import read_kernel_details
    from opscope.report.json_out import read_scan_json
    if run is None:
        run = Path(tempfile.mkdtemp(prefix="opscope-alexnet-")) / "run"
        scan_alexnet(run)
    result = read_scan_json(run)
    est = price(result.npu_estimate["basis"], "Ascend910B2", world_sizes=[1, 2])
    step = est["step"]
    predicted = step["kernel_types_us"]
    measured: Counter = Counter()
    for row in read_kernel_details(shared / ALEXNET / "kernel_details.csv"):
        if not row.type.startswith("hcom_"):
            measured[row.type] += row.duration_us
    with open(shared / ALEXNET / "step_trace_time.csv", newline="") as fh:
        trace = next(csv.DictReader(fh))
    parts = {"compute/memory": float(trace["Computing"]), "communication": float(trace["Communication(Not Overlapped)"]),
             "host": float(trace["Free"])}
    two = next(w for w in step["per_world_size"] if w["devices"] == 2)
    estimate_s, build_s, analysis_s = cost_of_estimate(run, result)
    return {"predicted_computing_us": two["device_us"], "measured_computing_us": float(trace["Computing"]),
            "predicted_computing_1_us": step["device_us"], "predicted_ddp_us": two["ddp_vector_us"],
            "predicted_shares": family_shares(predicted, two["device_us"]), "measured_shares": family_shares(dict(measured)),
            "predicted_bound_2": two["bound"], "predicted_bound_1": step["per_world_size"][0]["bound"],
            "measured_bound": max(parts, key=parts.get), "measured_parts_us": parts,
            "predicted_step_2_us": two["step_us"], "measured_step_us": float(trace["Stage"]),
            "transdata_kernels": step["transdata_kernels"], "estimate_s": estimate_s, "build_s": build_s,
            "analysis_s": analysis_s,
            "measured_transdata_kernels": sum(1 for r in read_kernel_details(shared / ALEXNET / "kernel_details.csv")
                                              if r.type == "TransData")}


def llm(shared: Path) -> dict:
    from opscope.analysis.npu_cost import kernel_from_row, kernel_time_us, log2_ratio, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    _, chip = resolve_chip("Ascend910B3")
    out = {}
    for rank in (0, 2):
        logs, within, total, worst = [], 0.0, 0.0, Counter()
        for row in read_kernel_details(shared / LLM.format(rank) / "kernel_details.csv"):
            kernel = kernel_from_row(row)
            if kernel.unit == "comm" or row.duration_us <= 0:
                continue
            ratio = log2_ratio(kernel_time_us(kernel, chip), row.duration_us)
            logs.append(abs(ratio))
            total += row.duration_us
            if abs(ratio) <= 1:
                within += row.duration_us
            else:
                worst[row.type] += row.duration_us
        out[rank] = {"kernels": len(logs), "within_2x": within / total, "median_abs_log2": statistics.median(logs),
                     "worst": worst.most_common(3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--run", default=None, help="an existing AlexNet b32 224 px scan folder (skips the scan)")
    args = ap.parse_args()
    shared = Path(args.shared)
    a = alexnet(shared, Path(args.run) if args.run else None)
    err = a["predicted_computing_us"] / a["measured_computing_us"] - 1
    print("(a) AlexNet b32 224px, Ascend910B2 estimate vs shared run rank 0 level 1")
    print(f"    computing per step on 2 devices: predicted {a['predicted_computing_us'] / 1000:.2f} ms (training "
          f"{a['predicted_computing_1_us'] / 1000:.2f} + DDP gradient scaling/copies {a['predicted_ddp_us'] / 1000:.2f}),"
          f" measured {a['measured_computing_us'] / 1000:.2f} ms ({err:+.0%})")
    for fam in FAMILIES:
        print(f"    {fam:22} share predicted {a['predicted_shares'][fam]:6.1%}  measured {a['measured_shares'][fam]:6.1%}")
    print(f"    TransData kernels per step: predicted {a['transdata_kernels']:.0f}, measured {a['measured_transdata_kernels']}")
    print(f"    bound: predicted {a['predicted_bound_2']} (2 devices; {a['predicted_bound_1']} on 1), measured "
          f"{a['measured_bound']} ({', '.join(f'{k} {v / 1000:.1f} ms' for k, v in a['measured_parts_us'].items())})")
    print(f"    cost: the estimate {a['estimate_s'] * 1000:.1f} ms = {a['estimate_s'] / a['analysis_s']:.1%} of the "
          f"scan's analysis step ({a['analysis_s'] * 1000:.0f} ms: result, scan.json, report.html/.xlsx) and "
          f"{a['estimate_s'] / a['build_s']:.0%} of building the result alone ({a['build_s'] * 1000:.0f} ms)")
    print(f"    step on 2 devices: predicted {a['predicted_step_2_us'] / 1000:.1f} ms, measured "
          f"{a['measured_step_us'] / 1000:.1f} ms")
    print("(b) LLM kernel_details, each kernel predicted from type, shapes and dtypes (Ascend910B3)")
    for rank, r in llm(shared).items():
        role = "used for fitting" if rank == 0 else "held out"
        print(f"    rank {rank} ({role}): {r['kernels']} kernels, {r['within_2x']:.1%} of kernel time within 2x, "
              f"median |log2 ratio| {r['median_abs_log2']:.2f}; most time outside 2x: "
              + ", ".join(f"{t} {us / 1000:.1f} ms" for t, us in r["worst"]))


if __name__ == "__main__":
    main()
