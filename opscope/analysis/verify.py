"""Judge replayed operator results and end-to-end losses against the standards.

Pure functions: tensors (or floats) in, plain dicts out.  The metrics are the ones Ascend
users know from msprobe's accuracy checker (cosine similarity, max absolute error, max
relative error, share of elements with relative error < 0.1 % / < 0.5 %); the thresholds
come from ``support_matrix/verify_standards.yaml`` where each one cites its source.
"""
from __future__ import annotations

import math

OUTCOMES = ("pass", "warn", "fail", "error", "skipped")
_RANK = {"pass": 0, "warn": 1, "fail": 2}
SUPPORTED_VERDICTS = ("native", "composite", "cpu-fallback")


def _dtype_key(dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_thresholds(dtype, standards: dict) -> dict:
    table = standards["dtypes"]
    return table.get(_dtype_key(dtype), table["default"])


# ------------------------------------------------------------------ metrics

def error_stats(actual, oracle, thresholds: dict) -> dict:
    """Errors of ``actual`` against the float64 ``oracle`` (both any float dtype, same shape).

    Relative error divides by max(|oracle|, small_value) so near-zero golden values do not
    blow it up (msprobe's small-value rule); small values are judged by absolute error.
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
    small_value = thresholds["small_value"]
    denom = o_f.abs().clamp_min(small_value)
    rel_err = abs_err / denom
    small = o_f.abs() < small_value
    normal = ~small
    norm_a, norm_o = float(a_f.norm()), float(o_f.norm())
    if norm_a == 0 and norm_o == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_o == 0:
        cosine = 0.0
    else:
        cosine = float((a_f @ o_f) / (norm_a * norm_o))
    count = max(int(finite.sum()), 1)
    rms_oracle = float(o_f[normal].pow(2).mean().sqrt()) if bool(normal.any()) else 0.0
    return {
        "numel": n,
        "cosine": cosine,
        "max_abs_err": float(abs_err.max()) if abs_err.numel() else 0.0,
        "max_rel_err": float(rel_err.max()) if rel_err.numel() else 0.0,
        "mean_rel_err": float(rel_err[normal].mean()) if bool(normal.any()) else 0.0,
        "ratio_rel_err_lt_0_001": float((rel_err < 1e-3).sum()) / count if n else 1.0,
        "ratio_rel_err_lt_0_005": float((rel_err < 5e-3).sum()) / count if n else 1.0,
        "rmse": float(abs_err[normal].pow(2).mean().sqrt()) if bool(normal.any()) else 0.0,
        "small_value_err": (float((abs_err[small] > thresholds["small_value_atol"]).sum()) / max(int(small.sum()), 1)
                            if bool(small.any()) else 0.0),
        "inf_nan_mismatch": inf_nan_mismatch,
        "rms_oracle": rms_oracle,
        "abs_threshold_violations": int(((rel_err > thresholds["rtol"]) & normal).sum()
                                        + ((abs_err > thresholds["small_value_atol"]) & small).sum()),
    }


PUBLIC_METRICS = ("cosine", "max_abs_err", "max_rel_err", "ratio_rel_err_lt_0_001", "ratio_rel_err_lt_0_005")


# ------------------------------------------------------------------ standards

def _accuracy_reached(stats: dict, rule: dict) -> bool:
    if stats["cosine"] < rule["hard_min_cosine"] or stats["max_abs_err"] > rule["hard_max_abs_err"]:
        return False
    return not (stats["cosine"] < rule["min_cosine"] and stats["max_abs_err"] > rule["max_abs_err_with_low_cosine"])


def _benchmark(dev: dict, ref: dict, thresholds: dict, standards: dict) -> tuple[str, str]:
    """msprobe benchmark method: device errors over CPU low-precision errors, per metric."""
    bench = standards["standards"]["benchmark"]
    noise = bench.get("noise_ulps", 2) * thresholds["unit_roundoff"]
    floors = {"small_value_err": 1.0 / max(dev["numel"], 1), "rmse": noise * max(ref["rms_oracle"], 1e-30),
              "max_rel_err": noise, "mean_rel_err": noise}
    worst, notes = "pass", []
    for metric, limits in bench["ratios"].items():
        ratio = max(dev[metric], floors[metric]) / max(ref[metric], floors[metric])
        dev.setdefault("ratios", {})[metric] = round(ratio, 4)
        status = "fail" if ratio > limits["fail"] else "warn" if ratio > limits["warn"] else "pass"
        if _RANK[status] > _RANK[worst]:
            worst = status
        if status != "pass":
            notes.append(f"{metric} {ratio:.3g}x the CPU's")
    return worst, "; ".join(notes)


def judge_tensor(base: str, device, reference, oracle, standards: dict, is_index: bool = False) -> dict:
    """Judge one output tensor.  Returns {outcome, standard, metrics, message}."""
    import torch
    if device is None and reference is None:
        return {"outcome": "pass", "standard": None, "metrics": {}, "message": ""}
    if device is None or reference is None:
        return {"outcome": "fail", "standard": "exact", "metrics": {},
                "message": "the device returned no tensor where the CPU did" if device is None
                else "the device returned a tensor where the CPU returned none"}
    if tuple(device.shape) != tuple(reference.shape):
        return {"outcome": "fail", "standard": "exact", "metrics": {},
                "message": f"shape {list(device.shape)} on the device, {list(reference.shape)} on the CPU"}
    if device.dtype != reference.dtype:
        return {"outcome": "fail", "standard": "exact", "metrics": {},
                "message": f"dtype {_dtype_key(device.dtype)} on the device, {_dtype_key(reference.dtype)} on the CPU"}
    if not (device.dtype.is_floating_point or device.dtype.is_complex) or is_index:
        mismatches = int((device != reference).sum())
        outcome = "pass" if mismatches == 0 else "fail"
        metrics = {"mismatches": mismatches, "numel": device.numel(), "cosine": None, "max_abs_err": None,
                   "max_rel_err": None, "ratio_rel_err_lt_0_001": None, "ratio_rel_err_lt_0_005": None}
        if device.numel() and (device.dtype.is_floating_point or device.dtype in (torch.int64, torch.int32)):
            metrics["max_abs_err"] = float((device.double() - reference.double()).abs().max())
        message = "" if mismatches == 0 else f"{mismatches} of {device.numel()} elements differ"
        return {"outcome": outcome, "standard": "exact", "metrics": metrics, "message": message}
    thresholds = dtype_thresholds(device.dtype, standards)
    golden = oracle if oracle is not None and tuple(oracle.shape) == tuple(device.shape) else None
    note = "" if golden is not None else "no float64 oracle for this op: judged against the CPU result"
    golden = golden if golden is not None else reference
    dev = error_stats(device, golden, thresholds)
    ref = error_stats(reference, golden, thresholds)
    absolute_ops = standards["standards"]["absolute"].get("ops") or []
    if base in absolute_ops and ref["abs_threshold_violations"] == 0 and ref["inf_nan_mismatch"] == 0:
        standard = "absolute"
        bad = dev["abs_threshold_violations"] + dev["inf_nan_mismatch"]
        outcome = "pass" if bad == 0 else "fail"
        message = "" if bad == 0 else (f"{bad} of {dev['numel']} elements outside rtol "
                                       f"{thresholds['rtol']:g} / small-value atol {thresholds['small_value_atol']:g}")
    else:
        standard = "benchmark"
        if dev["inf_nan_mismatch"] > ref["inf_nan_mismatch"]:
            outcome, message = "fail", f"{dev['inf_nan_mismatch']} inf/nan not where the CPU has them"
        else:
            outcome, message = _benchmark(dev, ref, thresholds, standards)
    rule = standards["accuracy_reached"]
    if outcome != "fail" and not _accuracy_reached(dev, rule) and _accuracy_reached(ref, rule):
        outcome = "fail"
        message = (f"cosine {dev['cosine']:.4f}, max abs err {dev['max_abs_err']:.3g}: accuracy not reached "
                   "(the CPU in the same dtype reaches it)")
    message = "; ".join(m for m in (message, note) if m)
    metrics = {k: dev[k] for k in PUBLIC_METRICS}
    metrics.update({"rmse": dev["rmse"], "mean_rel_err": dev["mean_rel_err"], "numel": dev["numel"],
                    "reference_max_rel_err": ref["max_rel_err"]})
    if "ratios" in dev:
        metrics["ratios"] = dev["ratios"]
    return {"outcome": outcome, "standard": standard, "metrics": metrics, "message": message}


def _tie_only(device_outs: list, reference: list, index_pos: int) -> bool:
    """Index outputs that differ only where the values output agrees exactly are ties."""
    values = [i for i, t in enumerate(reference) if i != index_pos and t is not None and t.dtype.is_floating_point]
    return bool(values) and all(device_outs[i] is not None and bool((device_outs[i] == reference[i]).all())
                                for i in values)


def judge_outputs(base: str, device_outs: list, reference: list, oracle: list | None, standards: dict) -> dict:
    """Judge every output of one call; the worst outcome wins.  Metrics are the first float output's."""
    if len(device_outs) != len(reference):
        return {"outcome": "fail", "standard": "exact", "metrics": {},
                "message": f"{len(device_outs)} outputs on the device, {len(reference)} on the CPU"}
    index_ops = set((standards.get("index_outputs") or {}).get("ops") or [])
    worst = {"outcome": "pass", "standard": None, "metrics": {}, "message": ""}
    headline = None
    for pos, (dev, ref) in enumerate(zip(device_outs, reference)):
        orc = oracle[pos] if oracle is not None and pos < len(oracle) else None
        is_index = base in index_ops and ref is not None and not ref.dtype.is_floating_point
        judged = judge_tensor(base, dev, ref, orc, standards, is_index=is_index)
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
    return {"outcome": worst["outcome"], "standard": worst["standard"] or shown["standard"],
            "metrics": shown["metrics"], "message": worst["message"]}


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


def summarise(rows: list[dict]) -> dict:
    counts = {k: 0 for k in OUTCOMES}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    counts["total"] = len(rows)
    counts["disagreements"] = sum(1 for r in rows if r.get("disagreement"))
    return counts


def result_rows(verification: dict) -> list[dict]:
    """Flat rows for tables (terminal, HTML, XLSX): one per signature, worst first."""
    order = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "skipped": 4}
    rows = []
    for r in (verification or {}).get("results", []):
        m = r.get("metrics") or {}
        rows.append({
            "outcome": r["outcome"], "op": r["op"] + (f".{r['overload']}" if r.get("overload") else ""),
            "input_shapes": r.get("input_shapes"), "dtypes": r.get("dtypes"),
            "cosine": m.get("cosine"), "max_abs_err": m.get("max_abs_err"), "max_rel_err": m.get("max_rel_err"),
            "ratio_rel_err_lt_0_001": m.get("ratio_rel_err_lt_0_001"),
            "ratio_rel_err_lt_0_005": m.get("ratio_rel_err_lt_0_005"),
            "standard": r.get("standard"), "predicted_verdict": r.get("predicted_verdict"),
            "disagreement": r.get("disagreement"), "message": r.get("message", ""),
        })
    rows.sort(key=lambda row: order.get(row["outcome"], 9))
    return rows


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
