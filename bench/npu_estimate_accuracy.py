"""How close opscope's NPU estimate comes to real Ascend profiles (not a timed test).

    python bench/npu_estimate_accuracy.py [--run RUN_DIR] [--shared ../shared]

(a) AlexNet batch 32, 224 px: scans examples/train_alexnet.py on this CPU (or reads
    --run, a folder of such a scan) and compares the estimate on the chip of the shared
    run (24 AI cores: Ascend910B2), at that job's world size (its HCCL group), with the
    shared AlexNet NPU run, rank 0, level 1: share of kernel time per kernel family,
    TransData, computing time per step (step_trace_time.csv "Computing"), the step and what
    bounds it; and every kernel of that run's kernel_details.csv predicted from its type,
    shapes and dtypes.
(b) Every kernel of the shared LLM profile's kernel_details.csv (ranks 0 and 2), predicted
    from its type, shapes and dtypes alone on the chip of that run (20 AI cores:
    Ascend910B3): the share of kernel time predicted within 2x and the median
    |log2(predicted / measured)|.

Both are reported twice, side by side:
- in-sample: the shipped figures (support_matrix/npu_cost_model.yaml), fitted on the AlexNet
  run's rank 0 and the LLM's rank 0 (npu_cost.FITTED_PROFILES); LLM rank 2 is held out;
- leave-one-out: every figure the predicted profile contributed to is re-derived without it
  (bench/derive_npu_cost_model.py's procedure on the other profile's kernels), or falls to
  its prior where the other profile has no launch of that kernel type: fitted without
  AlexNet, predict AlexNet; fitted without LLM rank 0, predict rank 0 (and rank 2).
  The structure (which kernels an operator becomes, when TransData is inserted, DDP's
  passes) was read off the profiles' operator tables too, and stays: it is not a timing.
Each report's calibration line states what its figures were fitted on.
"""
from __future__ import annotations

import argparse
import copy
import csv
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = "data/ascend_profiles"
ALEXNET = "data/ascend_profiles/alexnet_ddp_2rank/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT"
LLM = "data/ascend_profiles/llm_megatron_4rank_level2/rank_{}_ascend_pt/ASCEND_PROFILER_OUTPUT"
FAMILIES = {"conv+matmul": ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMulV2", "MatMulV3",
                            "BatchMatMul", "BatchMatMulV2"),
            "TransData": ("TransData",), "optimizer (foreach)": ("ForeachAddList", "ForeachMulScalar"),
            "pooling": ("MaxPoolWithArgmaxV1", "MaxPoolGradWithArgmaxV1", "AdaptiveAvgPool3d", "AdaptiveAvgPool3dGrad")}

# Figures of npu_cost_model.yaml set by hand from one profile (its comments say which), not by the
# per-kernel-type procedure: (section, kernel type or None, key, efficiency dtype key or None) -> profile.
HAND_FIGURES = {
    **{("kernels", t, "memory_efficiency", None): "alexnet_l1" for t in ("MatMulV2", "MatMulV3", "BatchMatMul",
                                                                          "BatchMatMulV2")},
    **{("kernels", t, "write_efficiency", None): "alexnet_l1" for t in ("MatMulV2", "MatMulV3", "BatchMatMul",
                                                                         "BatchMatMulV2")},
    # BatchMatMul* never ran in either profile: their efficiencies are MatMulV2's, copied
    **{("kernels", t, "efficiency", "fp32"): "alexnet_l1" for t in ("BatchMatMul", "BatchMatMulV2")},
    **{("kernels", t, "efficiency", "default"): "llm_r0" for t in ("BatchMatMul", "BatchMatMulV2")},
    ("host", None, "launch_us_per_op", None): "alexnet_l1",      # trace_view.json launch thread
    ("host", None, "fallback_copy_gbps", None): "alexnet_l1",
    ("host", None, "fallback_sync_us", None): "alexnet_l1",
}


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

    from opscope.analysis.npu.estimate import estimate
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
        estimate(result.operators, result.steps, capture.calls, "Ascend910B2")
        est.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        build_scan_result(capture=capture, **fields)
        build.append(time.perf_counter() - t0)
        capture = load_capture(run)
        t0 = time.perf_counter()
        analyse_capture(work, capture=capture, formats=("html", "xlsx"), **fields)
        full.append(time.perf_counter() - t0)
    return min(est), min(build), min(full)


# --- leave-one-out: the cost model refitted without one profile ---

def profile_csv(shared: Path, key: str) -> Path:
    from opscope.analysis.npu.cost import FITTED_PROFILES
    return shared / PROFILES / FITTED_PROFILES[key]["path"] / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"


def fit_samples(shared: Path) -> dict[str, list]:
    """Per kernel type: (profile, chip figures, Kernel, measured us) of every launch of the fitted profiles."""
    from opscope.analysis.npu.cost import FITTED_PROFILES, profile_kernels, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    per_type: dict[str, list] = defaultdict(list)
    for key, fig in FITTED_PROFILES.items():
        _, chip = resolve_chip(fig["chip"])
        rows = read_kernel_details(profile_csv(shared, key))
        for row, kernel in zip(rows, profile_kernels(rows), strict=True):
            if kernel.unit != "comm" and row.duration_us > 0:
                per_type[row.type].append((key, chip, kernel, row.duration_us))
    return per_type


def _vector_figures(items) -> dict:
    """floor_us and gbps of a vector kernel type from its launches (derive_npu_cost_model.py's procedure)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from derive_npu_cost_model import fit_vector
    if len(items) >= 3 and any(k.bytes for _, _, k, _ in items):
        floor, gbps = fit_vector(items)
        return {"floor_us": floor, "gbps": round(gbps)}
    small = [dur for _, _, k, dur in items if k.bytes < 256e3]
    floor = min(small) if small else 1.5
    big = [(k, dur, chip) for _, chip, k, dur in items if k.bytes >= 1e6 and dur > floor + 0.5] or \
          [(k, dur, chip) for _, chip, k, dur in items if k.bytes and dur > floor + 0.5]
    bws = [k.bytes / ((dur - floor) * 1e-6) / 1e9 * 1600 / chip["hbm_gbps"] for k, dur, chip in big]
    return {"floor_us": round(floor, 2), **({"gbps": round(statistics.median(bws))} if bws else {})}


def _efficiencies(items, unit: str) -> dict[str, float]:
    """Median achieved fraction of the cube peak of the dtype each kernel ran in (``cube_run``) per efficiency
    key (fp32 or hf32, else `default`)."""
    from opscope.analysis.npu.cost import cube_run
    floor = 12.0 if unit == "cube" else 20.0
    by_key: dict[str, list] = defaultdict(list)
    for _, chip, k, dur in items:
        run, peak, _ = cube_run(k, chip)
        if k.flops and dur > floor:
            by_key[run if run in ("fp32", "hf32") else "default"].append(k.flops / (peak * 1e12)
                                                                           / ((dur - floor) * 1e-6))
    return {key: round(statistics.median(v), 3) for key, v in by_key.items()}


def default_vector_gbps(samples: dict, keys) -> float | None:
    """default_vector's rate: the median bandwidth of every vector launch moving >= 1 MB."""
    bws = [k.bytes / ((dur - 1.5) * 1e-6) / 1e9 * 1600 / chip["hbm_gbps"]
           for items in samples.values() for key, chip, k, dur in items
           if key in keys and k.unit == "vector" and k.bytes >= 1e6 and dur > 1.5]
    return round(statistics.median(bws)) if bws else None


def refit(shipped: dict, samples: dict, held_out: str) -> tuple[dict, dict]:
    """The cost model with every figure ``held_out`` contributed to re-derived from the other profiles
    (or dropped to its prior where they have no launch of that kernel type), and what changed."""
    from opscope.analysis.npu.cost import FITTED_PROFILES, fitted_on
    rest = [k for k in FITTED_PROFILES if k != held_out]
    model = copy.deepcopy(shipped)
    kernels = model["kernels"]
    changed: dict[str, list] = defaultdict(list)
    for ktype, entry in list(kernels.items()):
        if ktype == "default_vector" or not isinstance(entry, dict):
            continue
        items = samples.get(ktype, [])
        held = [i for i in items if i[0] == held_out]
        others = [i for i in items if i[0] != held_out]
        unit = entry.get("unit", "vector")
        if unit in ("cube", "fa"):
            eff = entry.get("efficiency", {})
            eff = dict(eff) if isinstance(eff, dict) else {"default": eff}
            keys = set(_efficiencies(held, unit)) | {k[3] for k, src in HAND_FIGURES.items()
                                                      if k[1] == ktype and k[2] == "efficiency" and src == held_out}
            refitted = _efficiencies(others, unit)
            for key in sorted(keys):
                if key in refitted:
                    eff[key] = refitted[key]
                    changed["re-derived"].append(f"{ktype} {key} efficiency {refitted[key]}")
                else:
                    eff.pop(key, None)
                    changed["to the prior"].append(f"{ktype} {key} efficiency")
            entry["efficiency"] = eff
        elif unit in ("vector", "dma") and held:
            if others:
                entry.update(_vector_figures(others))
                changed["re-derived"].append(ktype)
            else:
                del kernels[ktype]
                changed["to the prior"].append(ktype)
    for (section, ktype, key, _), src in HAND_FIGURES.items():
        if src != held_out or key == "efficiency":
            continue
        table = model.get(section) or {}
        table = (table.get(ktype) or {}) if ktype else table
        if key in table:
            del table[key]
            changed["to the prior"].append(f"{ktype or section} {key}")
    gbps = default_vector_gbps(samples, rest)
    if gbps:
        kernels["default_vector"] = {**kernels.get("default_vector", {}), "gbps": gbps}
        changed["re-derived"].append(f"default_vector {gbps} GB/s")
    model["calibration"] = {"fitted_on": fitted_on(rest, held_out=FITTED_PROFILES[held_out]["what"]
                                                   + " (predicted here)"),
                            "leave_one_out": f"every figure {held_out} contributed to, re-derived without it"}
    return model, changed


@contextmanager
def cost_model_as(model: dict):
    """Price with ``model`` instead of support_matrix/npu_cost_model.yaml (every reader goes through
    ``knowledge.load``)."""
    from opscope import knowledge
    original = knowledge.load

    def load(name: str) -> dict:
        return model if name == "npu_cost_model.yaml" else original(name)
    knowledge.load = load   # type: ignore[assignment]
    try:
        yield model
    finally:
        knowledge.load = original   # type: ignore[assignment]


# --- the checks, priced with whatever cost model is in force ---

def kernel_check(csv_path: Path, chip_name: str) -> dict:
    """Every kernel of a kernel_details.csv predicted from its type, shapes and dtypes."""
    from opscope.analysis.npu.cost import kernel_time_us, log2_ratio, profile_kernels, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    _, chip = resolve_chip(chip_name)
    logs, within, total, worst = [], 0.0, 0.0, Counter()
    rows = read_kernel_details(csv_path)
    for row, kernel in zip(rows, profile_kernels(rows), strict=True):
        if kernel.unit == "comm" or row.duration_us <= 0:
            continue
        ratio = log2_ratio(kernel_time_us(kernel, chip), row.duration_us)
        logs.append(abs(ratio))
        total += row.duration_us
        if abs(ratio) <= 1:
            within += row.duration_us
        else:
            worst[row.type] += row.duration_us
    return {"kernels": len(logs), "within_2x": within / total, "median_abs_log2": statistics.median(logs),
            "worst": worst.most_common(3)}


def alexnet_measured(shared: Path) -> dict:
    from opscope.parsers.ascend_kernels import read_kernel_details
    measured: Counter = Counter()
    rows = read_kernel_details(shared / ALEXNET / "kernel_details.csv")
    for row in rows:
        if not row.type.startswith("hcom_"):
            measured[row.type] += row.duration_us
    with open(shared / ALEXNET / "step_trace_time.csv", newline="") as fh:
        trace = next(csv.DictReader(fh))
    parts = {"compute/memory": float(trace["Computing"]), "communication": float(trace["Communication(Not Overlapped)"]),
             "host": float(trace["Free"])}
    return {"computing_us": float(trace["Computing"]), "shares": family_shares(dict(measured)),
            "bound": max(parts, key=lambda k: parts[k]), "parts_us": parts, "step_us": float(trace["Stage"]),
            "transdata_kernels": sum(1 for r in rows if r.type == "TransData")}


def alexnet_predicted(basis, world: int) -> dict:
    """The estimate of the AlexNet run's basis (``EstimateBasis``) on one card and on ``world`` cards."""
    from opscope.analysis.npu.estimate import price
    est = price(basis, "Ascend910B2", world_sizes=[1, world])
    step = est.step
    one, many = step.per_world_size
    return {"computing_us": many.device_us, "computing_1_us": step.device_us, "ddp_us": many.ddp_vector_us,
            "shares": family_shares(step.kernel_types_us, many.device_us), "bound": many.bound,
            "bound_1": one.bound, "step_us": many.step_us, "host_us": many.host_us,
            "communication_us": many.communication_us, "exposed_us": many.exposed_communication_us,
            "transdata_kernels": step.transdata_kernels, "calibration": est.calibration["fitted_on"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--run", default=None, help="an existing AlexNet b32 224 px scan folder (skips the scan)")
    ap.add_argument("--no-cost", action="store_true", help="skip timing the estimate itself")
    args = ap.parse_args()
    shared = Path(args.shared)
    from opscope.analysis.npu.compare import world_size
    from opscope.analysis.npu.cost import FITTED_PROFILES, cost_model
    from opscope.report.json_out import read_scan_json
    run = Path(args.run) if args.run else None
    if run is None:
        run = Path(tempfile.mkdtemp(prefix="opscope-alexnet-")) / "run"
        scan_alexnet(run)
    result = read_scan_json(run)
    basis = result.npu_estimate.basis
    shipped = cost_model()
    samples = fit_samples(shared)
    world, world_source = world_size(shared / ALEXNET)
    loo_alexnet, changed_a = refit(shipped, samples, "alexnet_l1")
    loo_llm, changed_l = refit(shipped, samples, "llm_r0")

    measured = alexnet_measured(shared)
    inside = alexnet_predicted(basis, world)
    kernels_in = kernel_check(shared / ALEXNET / "kernel_details.csv", "Ascend910B2")
    with cost_model_as(loo_alexnet):
        out = alexnet_predicted(basis, world)
        kernels_out = kernel_check(shared / ALEXNET / "kernel_details.csv", "Ascend910B2")

    def ms(us: float) -> str:
        return f"{us / 1000:.2f} ms"

    def err(pred: float, real: float) -> str:
        return f"{pred / real - 1:+.0%}"

    print(f"(a) AlexNet b32 224px, Ascend910B2 x{world} ({world_source}) vs the shared run, rank 0, level 1")
    print(f"    {'':34} {'in-sample':>22} {'leave-one-out':>22} {'measured':>12}")
    rows = [("computing per step", f"{ms(inside['computing_us'])} {err(inside['computing_us'], measured['computing_us'])}",
             f"{ms(out['computing_us'])} {err(out['computing_us'], measured['computing_us'])}",
             ms(measured["computing_us"])),
            ("  of it DDP gradient scaling/copies", ms(inside["ddp_us"]), ms(out["ddp_us"]), "")]
    rows += [(f"  share {fam}", f"{inside['shares'][fam]:.1%}", f"{out['shares'][fam]:.1%}", f"{measured['shares'][fam]:.1%}")
             for fam in FAMILIES]
    rows += [("TransData kernels per step", f"{inside['transdata_kernels']:.0f}", f"{out['transdata_kernels']:.0f}",
              str(measured["transdata_kernels"])),
             ("every kernel within 2x (time)", f"{kernels_in['within_2x']:.1%}", f"{kernels_out['within_2x']:.1%}", ""),
             ("every kernel median |log2 ratio|", f"{kernels_in['median_abs_log2']:.2f}",
              f"{kernels_out['median_abs_log2']:.2f}", ""),
             ("host per step", ms(inside["host_us"]), ms(out["host_us"]), ""),
             ("all-reduce (transfers)", ms(inside["communication_us"]), ms(out["communication_us"]), ""),
             ("step", ms(inside["step_us"]), ms(out["step_us"]), ms(measured["step_us"])),
             ("bound", inside["bound"], out["bound"], measured["bound"])]
    for name, a, b, c in rows:
        print(f"    {name:34} {a:>22} {b:>22} {c:>12}")
    print(f"    measured parts: {', '.join(f'{k} {v / 1000:.1f} ms' for k, v in measured['parts_us'].items())}")
    print(f"    calibration (in-sample): {inside['calibration']}")
    print(f"    calibration (leave-one-out): {out['calibration']}")
    print(f"      re-derived from the LLM profile alone: {', '.join(changed_a['re-derived'])}")
    print(f"      to their prior (no launch of that kernel type in the LLM profile): "
          f"{', '.join(changed_a['to the prior'])}")
    if not args.no_cost:
        estimate_s, build_s, analysis_s = cost_of_estimate(run, result)
        print(f"    cost: the estimate {estimate_s * 1000:.1f} ms = {estimate_s / analysis_s:.1%} of the scan's analysis "
              f"step ({analysis_s * 1000:.0f} ms: result, scan.json, report.html/.xlsx) and {estimate_s / build_s:.0%} "
              f"of building the result alone ({build_s * 1000:.0f} ms)")

    print("(b) LLM kernel_details, each kernel predicted from type, shapes and dtypes (Ascend910B3)")
    checks = {rank: kernel_check(shared / LLM.format(rank) / "kernel_details.csv", "Ascend910B3") for rank in (0, 2)}
    with cost_model_as(loo_llm):
        loo = {rank: kernel_check(shared / LLM.format(rank) / "kernel_details.csv", "Ascend910B3") for rank in (0, 2)}
    for rank in (0, 2):
        for label, r in (("in-sample" if rank == 0 else "held out", checks[rank]), ("leave-one-out", loo[rank])):
            print(f"    rank {rank} {label:14}: {r['kernels']} kernels, {r['within_2x']:.1%} of kernel time within 2x, "
                  f"median |log2 ratio| {r['median_abs_log2']:.2f}; most time outside 2x: "
                  + ", ".join(f"{t} {us / 1000:.1f} ms" for t, us in r["worst"]))
    print(f"    calibration (in-sample): {shipped['calibration']['fitted_on']}")
    print(f"    calibration (leave-one-out): {loo_llm['calibration']['fitted_on']}")
    print(f"      re-derived from the AlexNet profile alone: {', '.join(changed_l['re-derived'])}")
    print(f"      to their prior (no launch of that kernel type in the AlexNet profile): "
          f"{', '.join(changed_l['to the prior'])}")
    print(f"    default_vector by the procedure: {default_vector_gbps(samples, list(FITTED_PROFILES))} GB/s on both "
          f"profiles (shipped {shipped['kernels']['default_vector'].get('gbps')})")


if __name__ == "__main__":
    main()
