"""Judge replayed operator results and end-to-end losses against the standards.

Pure functions: tensors (or floats) in, plain dicts out.  The metrics are the ones Ascend
users know from msprobe's accuracy checker (cosine similarity, max absolute error, max
relative error, share of elements with relative error < 0.1 % / < 0.5 %); the thresholds
come from ``support_matrix/verify_standards.yaml`` where each one cites its source.
"""
from __future__ import annotations

import math
from typing import Any

# measured: --device cpu, the CPU's own numerics against float64, nothing judged
OUTCOMES = ("pass", "warn", "fail", "error", "measured", "skipped")
_RANK = {"pass": 0, "warn": 1, "fail": 2}
SUPPORTED_VERDICTS = ("native", "composite", "cpu-fallback")


def _dtype_key(dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_thresholds(dtype, standards: dict) -> dict:
    table = standards["dtypes"]
    return table.get(_dtype_key(dtype), table["default"])


# ------------------------------------------------------------------ metrics

def error_stats(actual, oracle, thresholds: dict) -> dict:
    """msprobe benchmark metrics of ``actual`` against the float64 ``oracle`` (same shape).

    As msprobe 26.2.0 computes them (compare/algorithm.py, precision_standard/
    benchmark_compare.py): a value is small when |golden| <= small_value; small values are
    judged by absolute error (``small_value_err``: share of them above small_value_atol);
    relative error |err| / (|golden| + eps) and RMSE are over the other finite values.
    """
    import torch
    a = actual.detach().to("cpu", torch.float64).reshape(-1)
    o = oracle.detach().to("cpu", torch.float64).reshape(-1)
    n = a.numel()
    finite = torch.isfinite(a) & torch.isfinite(o)
    same_special = (~torch.isfinite(a)) & (~torch.isfinite(o)) & ((a == o) | (torch.isnan(a) & torch.isnan(o)))
    inf_nan_mismatch = int((~finite & ~same_special).sum())
    a_f, o_f = a[finite], o[finite]
    abs_err = (a_f - o_f).abs()
    small = o_f.abs() <= thresholds["small_value"]
    normal = ~small
    rel_err = abs_err / (o_f.abs() + torch.finfo(torch.float64).eps)
    rel_normal = rel_err[normal]
    norm_a, norm_o = float(a_f.norm()), float(o_f.norm())
    if norm_a == 0 and norm_o == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_o == 0:
        cosine = 0.0
    else:
        cosine = float((a_f @ o_f) / (norm_a * norm_o))
    count = max(int(normal.sum()), 1)
    return {
        "numel": n,
        "cosine": cosine,
        "max_abs_err": float(abs_err.max()) if abs_err.numel() else 0.0,
        "max_rel_err": float(rel_normal.max()) if rel_normal.numel() else 0.0,
        "mean_rel_err": float(rel_normal.mean()) if rel_normal.numel() else 0.0,
        "ratio_rel_err_lt_0_001": float((rel_normal < 1e-3).sum()) / count if rel_normal.numel() else 1.0,
        "ratio_rel_err_lt_0_005": float((rel_normal < 5e-3).sum()) / count if rel_normal.numel() else 1.0,
        "rmse": float(abs_err[normal].pow(2).mean().sqrt()) if bool(normal.any()) else 0.0,
        "small_value_err": (float((abs_err[small] > thresholds["small_value_atol"]).sum()) / int(small.sum())
                            if bool(small.any()) else 0.0),
        "inf_nan_mismatch": inf_nan_mismatch,
    }


def scaled_stats(actual, oracle, scale, thresholds: dict) -> dict:
    """The benchmark's error metrics on the scale a multiply-accumulate works on (cube ops).

    ``scale`` is the op run in float64 on the absolute values of its inputs (sum|a*b| per output,
    Higham's bound |fl(x.y) - x.y| <= gamma_n |x|.|y|): relative errors are |err| / scale, the RMSE
    is the root mean square of those; over every finite element (a result near zero after a
    cancellation is judged by the size of what was accumulated, not by its own).
    """
    import torch
    a = actual.detach().to("cpu", torch.float64).reshape(-1)
    o = oracle.detach().to("cpu", torch.float64).reshape(-1)
    s = scale.detach().to("cpu", torch.float64).reshape(-1).abs()
    finite = torch.isfinite(a) & torch.isfinite(o) & torch.isfinite(s)
    rel = (a[finite] - o[finite]).abs() / (s[finite] + torch.finfo(torch.float64).eps)
    if not rel.numel():
        return {"max_rel_err": 0.0, "mean_rel_err": 0.0, "rmse": 0.0}
    return {"max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean()), "rmse": float(rel.pow(2).mean().sqrt())}


def cube_family(base: str) -> str:
    """``conv`` or ``matmul``: which device setting (TF32/HF32) governs a cube op's float32 arithmetic."""
    return "conv" if "conv" in base else "matmul"


def is_cube(base: str, dtype, standards: dict, reduced_fp32: bool = False) -> bool:
    """A low-precision matmul/convolution output, judged on its accumulated magnitude (``standards.cube``);
    ``reduced_fp32``: the device runs this op's float32 with a 10-bit mantissa (TF32/HF32), so float32 too."""
    cube = (standards.get("standards") or {}).get("cube") or {}
    if base not in (cube.get("ops") or []):
        return False
    return _dtype_key(dtype) in (cube.get("dtypes") or []) or (reduced_fp32 and _dtype_key(dtype) == "float32")


PUBLIC_METRICS = ("cosine", "max_abs_err", "max_rel_err", "ratio_rel_err_lt_0_001", "ratio_rel_err_lt_0_005")
RATIO_METRICS = ("small_value_err", "rmse", "max_rel_err", "mean_rel_err")


# ------------------------------------------------------------------ standards

def accuracy_reached(stats: dict, rule: dict) -> bool:
    if stats["cosine"] < rule["hard_min_cosine"] or stats["max_abs_err"] > rule["hard_max_abs_err"]:
        return False
    return not (stats["cosine"] < rule["min_cosine"] and stats["max_abs_err"] > rule["max_abs_err_with_low_cosine"])


def api_level(base: str, standards: dict) -> str:
    """msprobe's API level (L0 unless listed), which sets the benchmark thresholds."""
    lists = standards["standards"]["benchmark"]["level_apis"]
    for level in ("L2", "L1"):
        if base in (lists.get(level) or []):
            return level
    return "L0"


def benchmark_thresholds(base: str, standards: dict) -> dict:
    bench = standards["standards"]["benchmark"]
    return {"small_value_err": float(bench["small_value_err_ratio"]["threshold"]),
            **{k: float(v) for k, v in bench["levels"][api_level(base, standards)].items()}}


def _benchmark(base: str, dev: dict, ref: dict, thresholds: dict, standards: dict,
               scaled: tuple[dict, dict] | None = None) -> tuple[str, str]:
    """msprobe benchmark method: each device metric over the reference's (floored at min_err).

    ``scaled``: the device's and the reference's relative errors and RMSE on the accumulated
    magnitude (cube ops), which then replace those of ``dev`` and ``ref`` in the ratios.
    """
    limits = benchmark_thresholds(base, standards)
    floor = thresholds["min_err"]
    worst, notes = "pass", []
    on_scale = ("max_rel_err", "mean_rel_err", "rmse") if scaled else ()
    for metric in RATIO_METRICS:
        mine, theirs = (scaled[0][metric], scaled[1][metric]) if scaled and metric in on_scale \
            else (dev[metric], ref[metric])
        ratio = abs(mine) / max(abs(theirs), floor)
        dev.setdefault("ratios", {})[metric] = round(ratio, 4)
        if ratio > limits[metric]:  # msprobe: error above the threshold, else pass
            worst = "fail"
            what = f"{metric} on the accumulated magnitude" if metric in on_scale else metric
            notes.append(f"{what} {ratio:.3g}x the CPU's (limit {limits[metric]:g}, {api_level(base, standards)})")
    return worst, "; ".join(notes)


def judge_tensor(base: str, device, reference, oracle, standards: dict, is_index: bool = False,  # noqa: C901
                 scale=None, reduced_fp32: bool = False) -> dict:
    """Judge one output tensor.  Returns {outcome, standard, metrics, message}.

    ``scale``: the op's float64 result on its inputs' absolute values, for a low-precision cube
    op (``is_cube``): its relative errors and RMSE are then judged on that magnitude.
    ``reduced_fp32``: the device runs this cube op's float32 as TF32/HF32 (``cube.reduced_fp32``).
    """
    # above complexity 15: one branch per way two outputs can differ (missing, shape, dtype, exact, float)
    import torch
    if device is None and reference is None:
        return {"outcome": "pass", "standard": None, "metrics": {}, "message": ""}
    if device is None or reference is None:
        return {"outcome": "fail", "standard": "binary", "metrics": {},
                "message": "the device returned no tensor where the CPU did" if device is None
                else "the device returned a tensor where the CPU returned none"}
    if tuple(device.shape) != tuple(reference.shape):
        return {"outcome": "fail", "standard": "binary", "metrics": {},
                "message": f"shape {list(device.shape)} on the device, {list(reference.shape)} on the CPU"}
    if device.dtype != reference.dtype:
        return {"outcome": "fail", "standard": "binary", "metrics": {},
                "message": f"dtype {_dtype_key(device.dtype)} on the device, {_dtype_key(reference.dtype)} on the CPU"}
    if not (device.dtype.is_floating_point or device.dtype.is_complex) or is_index:
        mismatches = int((device != reference).sum())
        outcome = "pass" if mismatches == 0 else "fail"
        metrics = {"mismatches": mismatches, "numel": device.numel(), "cosine": None, "max_abs_err": None,
                   "max_rel_err": None, "ratio_rel_err_lt_0_001": None, "ratio_rel_err_lt_0_005": None}
        if device.numel() and (device.dtype.is_floating_point or device.dtype in (torch.int64, torch.int32)):
            metrics["max_abs_err"] = float((device.double() - reference.double()).abs().max())
        message = "" if mismatches == 0 else f"{mismatches} of {device.numel()} elements differ"
        return {"outcome": outcome, "standard": "binary", "metrics": metrics, "message": message}
    thresholds = dtype_thresholds(device.dtype, standards)
    golden = oracle if oracle is not None and tuple(oracle.shape) == tuple(device.shape) else None
    note = "" if golden is not None else "no float64 oracle for this op: judged against the CPU result"
    golden = golden if golden is not None else reference
    dev = error_stats(device, golden, thresholds)
    ref = error_stats(reference, golden, thresholds)
    standard = "benchmark"
    scaled = None
    if scale is not None and tuple(scale.shape) == tuple(device.shape) \
            and is_cube(base, device.dtype, standards, reduced_fp32):
        scaled = (scaled_stats(device, golden, scale, thresholds), scaled_stats(reference, golden, scale, thresholds))
        standard = "benchmark (cube)"
        if not is_cube(base, device.dtype, standards):   # float32 run as TF32/HF32: that precision's floor
            thresholds = dict(thresholds, min_err=float(standards["standards"]["cube"]["reduced_fp32"]["min_err"]))
            standard = "benchmark (cube, TF32/HF32)"
    if dev["inf_nan_mismatch"] > ref["inf_nan_mismatch"]:
        outcome, message = "fail", f"{dev['inf_nan_mismatch']} inf/nan not where the CPU has them"
    else:
        outcome, message = _benchmark(base, dev, ref, thresholds, standards, scaled)
    rule = standards["accuracy_reached"]
    if outcome != "fail" and not accuracy_reached(dev, rule) and accuracy_reached(ref, rule):
        outcome = "fail"
        message = (f"cosine {dev['cosine']:.4f}, max abs err {dev['max_abs_err']:.3g}: accuracy not reached "
                   "(the CPU in the same dtype reaches it)")
    message = "; ".join(m for m in (message, note) if m)
    metrics = {k: dev[k] for k in PUBLIC_METRICS}
    metrics.update({"rmse": dev["rmse"], "mean_rel_err": dev["mean_rel_err"], "numel": dev["numel"],
                    "small_value_err": dev["small_value_err"], "reference_max_rel_err": ref["max_rel_err"],
                    "level": api_level(base, standards)})
    if "ratios" in dev:
        metrics["ratios"] = dev["ratios"]
    if scaled:
        metrics["accumulated_magnitude"] = {"device": scaled[0], "reference": scaled[1]}
    return {"outcome": outcome, "standard": standard, "metrics": metrics, "message": message}


def measure_tensor(actual, oracle, standards: dict) -> dict:
    """msprobe metrics of one result against the float64 oracle, nothing judged (the CPU's own numerics)."""
    stats = error_stats(actual, oracle, dtype_thresholds(actual.dtype, standards))
    return {k: stats[k] for k in (*PUBLIC_METRICS, "rmse", "mean_rel_err", "small_value_err", "numel")}


def _tie_only(device_outs: list, reference: list, index_pos: int) -> bool:
    """Index outputs that differ only where the values output agrees exactly are ties."""
    values = [i for i, t in enumerate(reference) if i != index_pos and t is not None and t.dtype.is_floating_point]
    return bool(values) and all(device_outs[i] is not None and bool((device_outs[i] == reference[i]).all())
                                for i in values)


def backend_outputs(base: str, standards: dict) -> dict[int, str]:
    """Output position -> why it is not compared: it names the backend (``backend_outputs``)."""
    table = ((standards.get("backend_outputs") or {}).get("ops") or {}).get(base) or {}
    return {int(k): str(v) for k, v in table.items()}


def judge_outputs(base: str, device_outs: list, reference: list, oracle: list | None, standards: dict,  # noqa: C901
                  scale: list | None = None, reduced_fp32: bool = False) -> dict:
    """Judge every output of one call; the worst outcome wins.  Metrics are the first float output's.

    Outputs that name the backend are not compared: ``metrics["not_compared"]`` lists them with
    the reason, and the message says so.  ``scale``: the op's outputs on its inputs' absolute
    values (cube ops, see ``judge_tensor``).
    """
    # above complexity 15: outputs skipped, index ties and the headline metrics are decided here in one pass
    if len(device_outs) != len(reference):
        return {"outcome": "fail", "standard": "binary", "metrics": {},
                "message": f"{len(device_outs)} outputs on the device, {len(reference)} on the CPU"}
    index_ops = set((standards.get("index_outputs") or {}).get("ops") or [])
    skipped = backend_outputs(base, standards)
    worst: dict[str, Any] = {"outcome": "pass", "standard": None, "metrics": {}, "message": ""}
    headline = None
    not_compared = []
    for pos, (dev, ref) in enumerate(zip(device_outs, reference, strict=True)):
        if pos in skipped:
            not_compared.append({"output": pos, "reason": skipped[pos]})
            continue
        orc = oracle[pos] if oracle is not None and pos < len(oracle) else None
        mag = scale[pos] if scale is not None and pos < len(scale) else None
        is_index = base in index_ops and ref is not None and not ref.dtype.is_floating_point
        judged = judge_tensor(base, dev, ref, orc, standards, is_index=is_index, scale=mag, reduced_fp32=reduced_fp32)
        if is_index and judged["outcome"] == "fail" and _tie_only(device_outs, reference, pos):
            judged["outcome"] = "warn"
            judged["message"] = f"indices differ at ties ({judged['message']}); the values match exactly"
        if judged["message"] and len(device_outs) > 1:
            judged["message"] = f"output {pos}: {judged['message']}"
        if headline is None and judged["metrics"].get("cosine") is not None:
            headline = judged
        if _RANK[judged["outcome"]] > _RANK[worst["outcome"]]:
            worst = judged
        elif worst["standard"] is None:
            worst = dict(judged, outcome=worst["outcome"]) if judged["outcome"] == "pass" else worst
    shown = headline or worst
    metrics, message = shown["metrics"], worst["message"]
    if not_compared:
        metrics = dict(metrics, not_compared=not_compared)
        note = "; ".join(f"output {n['output']} not compared: {n['reason']}" for n in not_compared)
        message = "; ".join(m for m in (message, note) if m)
    return {"outcome": worst["outcome"], "standard": worst["standard"] or shown["standard"],
            "metrics": metrics, "message": message}


# ------------------------------------------------------------------ predictions and summary

def prediction_disagreement(outcome: str, predicted: str | None, device_type: str) -> str | None:
    """Where the replay contradicts the scan's support verdict (which targets torch_npu).

    Only meaningful when the device is an NPU; elsewhere returns None.  A numeric ``fail`` is
    an accuracy finding, not a support disagreement.
    """
    if device_type != "npu" or predicted in (None, "unknown", "not-applicable") or outcome == "skipped":
        return None
    if outcome == "error" and predicted in SUPPORTED_VERDICTS:
        return f"predicted {predicted}, but the op raised on the NPU"
    if outcome in ("pass", "warn", "fail") and predicted == "unsupported":
        return "predicted unsupported, but the op ran on the NPU"
    return None


def msprobe_outcome(outcome: str, standards: dict) -> str | None:
    """opscope's pass/warn/fail as msprobe names it (verify_standards.yaml ``outcomes``)."""
    names = {v: k for k, v in (standards.get("outcomes") or {}).items() if k != "source"}
    return names.get(outcome)


def summarise(rows: list[dict]) -> dict:
    counts = {k: 0 for k in OUTCOMES}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    counts["total"] = len(rows)
    counts["disagreements"] = sum(1 for r in rows if r.get("disagreement"))
    return counts


# ------------------------------------------------------------------ end-to-end losses

def compare_series(reference: list, candidate: list, rtol: float, atol: float) -> dict:
    """Step-by-step comparison of two per-step series (losses or grad norms)."""
    steps, first_bad = [], None
    for i in range(max(len(reference), len(candidate))):
        r = reference[i] if i < len(reference) else None
        c = candidate[i] if i < len(candidate) else None
        if r is None or c is None or not (math.isfinite(r) and math.isfinite(c)):
            ok = r is not None and c is not None and (r == c or (math.isnan(r) and math.isnan(c)))
            diff = None
        else:
            diff = abs(c - r)
            ok = diff <= atol + rtol * abs(r)
        if not ok and first_bad is None:
            first_bad = i + 1
        steps.append({"step": i + 1, "reference": r, "candidate": c, "abs_diff": diff,
                      "rel_diff": (diff / abs(r)) if diff is not None and r else None, "ok": bool(ok)})
    return {"steps": steps, "first_divergent_step": first_bad, "within_tolerance": first_bad is None}


def compare_losses(reference: dict, candidate: dict, rtol: float = 1e-2, atol: float = 1e-3) -> dict:
    """Verdict of the e2e pass from the two runs' ``e2e_losses.json`` contents."""
    loss = compare_series(reference.get("loss", []), candidate.get("loss", []), rtol, atol)
    grads = compare_series(reference.get("grad_norm", []), candidate.get("grad_norm", []), rtol * 5, atol)
    n_ref, n_cand = len(reference.get("loss", [])), len(candidate.get("loss", []))
    if n_ref == 0 or n_cand == 0:
        verdict = "error"
        message = "no loss was recorded (the script never called backward())"
    elif loss["within_tolerance"]:
        verdict = "pass"
        message = f"losses agree for all {n_ref} steps within rtol {rtol:g} / atol {atol:g}"
        if not grads["within_tolerance"] and reference.get("grad_norm"):
            verdict = "warn"
            message += f"; gradient norms differ from step {grads['first_divergent_step']}"
    else:
        verdict = "fail"
        step = loss["first_divergent_step"]
        row = loss["steps"][step - 1]
        message = (f"loss differs from step {step}: {row['candidate']} on the candidate vs "
                   f"{row['reference']} on the reference (rtol {rtol:g}, atol {atol:g})")
    return {"verdict": verdict, "message": message, "rtol": rtol, "atol": atol,
            "loss": loss, "grad_norm": grads}
