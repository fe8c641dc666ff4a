"""What a ``--mode fake`` scan adds to its result: no CPU timings, the data-dependent places, the memory fit.

A fake run dispatches every operator without data, so its host times measure opscope's
bookkeeping, not the kernels: they are dropped (the readiness score then weighs signatures
only) and labelled ``not measured in fake mode``.  Each place where the run had to invent
a value or a size (``support_matrix/fake_mode.yaml``) is listed with its line: results
after it can differ from a real run.
"""
from __future__ import annotations

from opscope.model import FakeMode, FakePlace, ScanResult, ScanSummary

NOT_MEASURED = "not measured in fake mode"


def apply_fake(result: ScanResult, record: dict | None) -> None:
    """Fold the capture's fake-mode record (``capture/fake.json``) into ``result``."""
    from opscope.analysis.npu.memory_fit import FAKE_BASIS, memory_fit
    record = record or {}
    if result.settings.mode == "fake":
        _drop_timings(result)
        collectives = record.get("collectives") or []
        result.fake_mode = FakeMode.from_dict(
            {"places": record.get("places") or [], "optimizers": record.get("optimizers") or [],
             "collectives": collectives, "skipped_forwards": record.get("skipped_forwards") or [],
             "timings": NOT_MEASURED, "factory_fake_mb": record.get("factory_fake_mb")}, "capture/fake.json")
        places = result.fake_mode.places
        result.notes.insert(0, "fake mode: model, optimizer state and activations ran as fake tensors (shapes and "
                               "dtypes, no data); data loading ran for real; CPU timings are "
                               f"{NOT_MEASURED}")
        for place in places:
            result.notes.append(describe_place(place))
        for c in collectives:
            result.notes.append(f"fake mode: {c.get('where') or 'library code'} {c.get('op')}: "
                                f"{_size(c.get('bytes', 0))} per call, {c.get('count')} call(s) (shape-only: "
                                "not sent; the size is the communication volume per rank)")
        for s in record.get("skipped_forwards") or []:
            result.notes.append(f"fake mode: {s.get('where') or 'library code'} {s.get('count')} repeated no-grad "
                                f"forward(s) of {s.get('module')} with input shapes already seen were not re-run "
                                "(the profiler was not recording them): each returned fake outputs of the first "
                                "call's shapes and dtypes")
    memory = record.get("memory") or {}
    attention = attention_basis(memory.get("fused_attention") or {})
    fit = memory_fit(memory, result.settings.chip, f"{FAKE_BASIS}; {attention}" if attention else FAKE_BASIS)
    if fit is not None:
        result.memory_fit = fit
        if attention and result.settings.mode == "fake":
            result.notes.append(f"memory fit: {attention}")


def attention_basis(attention: dict) -> str | None:
    """How the memory fit counted ``F.scaled_dot_product_attention`` (``fake_mode.MemoryTracker``), or None."""
    calls = int(attention.get("calls") or 0)
    if not calls:
        return None
    unfused = int(attention.get("unfused_peak_bytes") or 0)
    return (f"attention counted as the NPU runs it ({calls} F.scaled_dot_product_attention call(s) are torch_npu's "
            "fused FlashAttentionScore): its output and softmax statistics "
            f"({int(attention.get('saved_bytes_per_query_row') or 0)} B per query row) are kept for the backward, "
            "the CPU kernel's batch x heads x Sq x Skv intermediates are not counted"
            + (f" (counted, they would have made the peak {_size(unfused)})" if unfused else ""))


def describe_place(place: FakePlace) -> str:
    kinds = {"value-read": "read a value back from a fake tensor",
             "bool-read": "branched on a fake tensor",
             "data-dependent-size": "ran a data-dependent-size operator on fake inputs",
             "checkpoint-save": "saved a checkpoint of the fake model"}
    kind = str(place.kind)
    what = kinds.get(kind, kind)
    return (f"fake mode: {place.where or 'library code'} {what} ({place.op}, {place.count}x): "
            f"{place.policy}; results after this line can differ from a real run"
            + ("; on the NPU the output size varies with the data (dynamic shape, often an AI CPU operator)"
               if place.kind == "data-dependent-size" else ""))


def _drop_timings(result: ScanResult) -> None:
    for op in result.operators:
        op.self_time_us = op.total_time_us = op.device_time_us = 0.0
        op.steady_time_us = op.steady_device_time_us = None
    if not result.summary.is_empty():
        from opscope.analysis.verdicts.support import readiness_summary
        old = result.summary
        result.summary = ScanSummary.from_dict(readiness_summary(result), "$.summary")
        if old.score_unavailable is not None:   # nothing was measured: no score, and why
            if old.readiness_score is None:
                result.summary.readiness_score = None
            result.summary.score_unavailable = old.score_unavailable
        result.summary.time_basis = NOT_MEASURED


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"
