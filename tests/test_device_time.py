"""Kernel time per operator: a GPU run's device tasks charged to the operators that launched them.

The shared H200 traces (``../shared/data/gpu_h200_torch2.11``) replay through the scan's own event path
(``calls_from_kineto`` and ``compact_calls``, fed ``_KinetoEvent``-like events built from the trace by
``tests/kineto_trace.py``); the builder's id spaces are checked on constructed records.
"""
from __future__ import annotations

import gzip
import shutil
from collections import Counter

import pytest
from conftest import SHARED

from opscope.parsers.calls import MARK, OPERATOR, PRIVATE, CallBuilder, Launch, Reading

GPU_DATA = SHARED / "data" / "gpu_h200_torch2.11"


def _trace(model: str, step: int):
    path = GPU_DATA / model / "traces" / f"step_{step:04d}.json.gz"
    if not path.is_file():
        pytest.skip(f"the shared GPU traces are not here ({path})")
    return path


def _scan_calls(path, step: int):
    """The calls the scan's step writer builds from this step's events (released as they are read)."""
    pytest.importorskip("torch")
    from kineto_trace import kineto_events, load_trace

    from opscope.capture.events import calls_from_kineto, compact_calls

    events = kineto_events(load_trace(path))
    return compact_calls(calls_from_kineto(events, step, [], None, release=True))


# operators that launch most of the step's kernels: matrix products, attention, convolutions, norms
KNOWN = {
    "gpt2": ("aten::mm", "aten::_scaled_dot_product_cudnn_attention",
             "aten::_scaled_dot_product_cudnn_attention_backward", "aten::native_layer_norm", "aten::_fused_adamw_"),
    "cnn": ("aten::addmm", "aten::mm", "aten::_convolution", "aten::convolution_backward", "aten::cudnn_batch_norm"),
}


@pytest.mark.parametrize("model", ["cnn", "gpt2"])
@pytest.mark.parametrize("step", [2, 3])
def test_gpu_trace_kernel_time_is_charged_to_operators(model, step):
    from kineto_trace import device_total_us, load_trace

    path = _trace(model, step)
    total = device_total_us(load_trace(path))
    calls = _scan_calls(path, step)
    charged = sum(c.device_time_us for c in calls)
    assert total > 0
    assert abs(charged - total) <= 0.05 * total, (model, step, charged, total)
    by_name: Counter = Counter()
    for c in calls:
        by_name[c.name] += c.device_time_us
    assert all(by_name[name] > 0 for name in KNOWN[model]), {name: by_name[name] for name in KNOWN[model]}
    # an operator that launched work ran on the device
    assert all(c.device == "device" for c in calls if c.device_time_us > 0)


def test_scan_and_diff_charge_a_trace_alike(tmp_path):
    # the scan (live events) and `opscope diff` (the exported trace) share one builder: the same operators
    # get the same kernel time from the same step
    from opscope.parsers.chrome_trace import load_chrome_trace

    path = _trace("gpt2", 2)
    plain = tmp_path / "step.json"
    with gzip.open(path) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    filed: Counter = Counter()
    for c in load_chrome_trace(plain).calls:
        filed[c.name] += c.device_time_us
    live: Counter = Counter()
    for c in _scan_calls(path, 2):
        live[c.name] += c.device_time_us
    assert sum(live.values()) == pytest.approx(sum(filed.values()), rel=1e-3)
    assert {k: round(v, 1) for k, v in live.items() if v} == {k: round(v, 1) for k, v in filed.items() if v}


def _reading():
    kinds = {"aten::linear": OPERATOR, "aten::mm": OPERATOR, "cudnn_thing": PRIVATE, "aten::inner": OPERATOR,
             "cudaLaunchKernel": MARK, "range": MARK}
    return Reading(classify=kinds.__getitem__, details=lambda rec: ([], [], [], None), phase_of=lambda name: None)


def test_device_tasks_find_their_operator_without_crossing_id_spaces():
    # host-space ids (External id) 5..9; device-space ids (CUPTI correlation) deliberately the same numbers
    records = [
        (0, 100, "aten::linear", -1, 5, 1), (10, 50, "aten::mm", -1, 6, 1),
        (20, 2, "cudaLaunchKernel", -1, Launch(5, 6), 1),     # device id 5 = the linear's host id
        (70, 20, "cudnn_thing", -1, 7, 1), (72, 5, "aten::inner", -1, 8, 1),
        (200, 50, "range", -1, 9, 1), (210, 2, "cudaLaunchKernel", -1, Launch(6, 9), 1),
    ]
    builder = CallBuilder(_reading())
    builder.add_thread(list(records), thread=1)
    builder.close()
    linear, mm = 0, 1
    assert builder.owner_of_device(5, 6) == mm          # the launch with the task's id, not the op with host id 5
    assert builder.owner_of_device(99, 5) == linear     # no launch: the host range the task links to
    assert builder.owner_of_device(99, 7) == linear     # a backend-private kernel's work is its operator's
    assert builder.owner_of_device(99, 8) == linear     # and so is an operator folded into it
    assert builder.owner_of_device(6, 9) is None        # launched in a range outside any operator
    assert builder.owner_of_device(99, None) is None and builder.owner_of_device(None, 12345) is None


def test_an_unlinked_launch_is_charged_by_nesting():
    records = [(0, 100, "aten::mm", -1, 5, 1), (20, 2, "cudaLaunchKernel", -1, Launch(40, 0), 1)]
    builder = CallBuilder(_reading())
    builder.add_thread(list(records), thread=1)
    builder.close()
    builder.charge(builder.owner_of_device(40, 0), 3.0)
    (mm,) = builder.finish()
    assert (mm.device, mm.device_time_us) == ("device", 3.0)


def test_a_torch_without_activity_types_charges_alike(monkeypatch):
    # torch builds whose _KinetoEvent has no activity_type(): a runtime call is told by its link to an operator,
    # a device annotation by is_user_annotation()
    from opscope.capture import events

    path = _trace("gpt2", 2)
    with_types = sum(c.device_time_us for c in _scan_calls(path, 2))
    monkeypatch.setattr(events, "_ACTIVITY", False)
    assert sum(c.device_time_us for c in _scan_calls(path, 2)) == pytest.approx(with_types)


# ---------------------------------------------------------------------------------------------- the reports

def _gpt2_scan_with_device_time():
    """The shared GPT-2 scan (written when every device_time_us read 0), its operators' kernel time re-derived
    from its steps' traces through the scan's event path: the scan as the fixed capture writes it."""
    from statistics import median

    from opscope.model import freeze
    from opscope.schema import load_scan

    scan_json = GPU_DATA / "gpt2" / "scan.json"
    if not scan_json.is_file():
        pytest.skip(f"the shared GPU scan is not here ({scan_json})")
    result = load_scan(scan_json)
    steady = [2, 3, 4, 5]
    per_step: dict = {}
    for step in steady:
        for c in _scan_calls(_trace("gpt2", step), step):
            key = (c.name, freeze(c.input_shapes), freeze(c.dtypes))
            per_step.setdefault(key, Counter())[step] += c.device_time_us
    matched = 0
    for op in result.operators:
        steps = per_step.get((op.name, freeze(op.input_shapes), freeze(op.dtypes)))
        op.device_time_us = round(sum(steps.values()), 3) if steps else 0.0
        op.steady_device_time_us = round(median(steps.get(s, 0.0) for s in steady), 3) if steps else 0.0
        matched += bool(steps)
    assert matched > 20
    return result


def test_a_gpu_scan_ranks_its_costliest_operators_by_gpu_time():
    from opscope.report import html, markdown, terminal, view, xlsx

    result = _gpt2_scan_with_device_time()
    assert view.has_device_time(result)
    costly = view.costliest_operators(result)
    top = max((op for op in result.operators if op.verdict != "not-applicable"),
              key=lambda op: op.steady_device_time_us or 0.0)
    assert costly[0][0] is top and costly[0][1] > 0 and costly[0][2] > 0
    assert "aten::mm" in {op.name for op, _, _ in costly[:12]}
    device = [d for _, d, _ in costly]
    assert device == sorted(device, reverse=True)   # host time only breaks ties
    rows = [r for r in view.operator_rows(result) if r.verdict != "not-applicable"]
    assert rows[0].time_us == rows[0].device_time_us == max(r.device_time_us for r in rows) > 0
    assert [r.time_us for r in rows] == sorted((r.time_us for r in rows), reverse=True)
    assert sum(r.share for r in view.operator_rows(result)) == pytest.approx(1.0)
    assert all(r.host_time_us >= 0 for r in rows) and any(r.host_time_us > 0 for r in rows)

    table = terminal.top_operators_table(result)
    assert table is not None and "GPU" in str(table.title)
    assert [c.header for c in table.columns][2:4] == ["GPU ms/step", "CPU ms/step"]
    keys = [c["key"] for c in html.operator_columns(result)]
    assert keys[keys.index("time_ms") + 1] == "host_ms"
    context = html.build_context(result, charts={})
    assert context["device_time"] and '"host_ms"' in str(context["ops_json"])
    text = markdown.render_markdown(result)
    assert "## Costliest operators on the GPU" in text and "| aten::mm" in text.split("on the GPU", 1)[1]
    assert text.split("on the GPU", 1)[1].index(top.name) < text.split("on the GPU", 1)[1].index("| aten::mm")
    assert xlsx.DEVICE_OPERATOR_HEADERS[5:8] == ["GPU time ms", "host time ms", "GPU time share"]


def test_a_scan_without_device_time_reports_as_before():
    from opscope.model import Operator, ScanResult
    from opscope.report import html, markdown, terminal, view

    result = ScanResult(script="train.py", operators=[
        Operator(name="aten::mm", calls=2, self_time_us=30.0, steady_time_us=15.0, verdict="native"),
        Operator(name="aten::add", calls=2, self_time_us=50.0, steady_time_us=25.0, verdict="native")])
    assert not view.has_device_time(result)
    assert [row[0].name for row in view.costliest_operators(result)] == ["aten::add", "aten::mm"]
    assert [r.name for r in view.operator_rows(result)] == ["aten::add", "aten::mm"]
    assert html.operator_columns(result) is html.COLUMNS
    table = terminal.top_operators_table(result)
    assert table is not None and "CPU time" in str(table.title) and "GPU ms/step" not in [c.header for c in table.columns]
    assert "on the GPU" not in markdown.render_markdown(result)


def test_a_batched_session_gives_each_kernel_the_step_of_its_launch_not_of_a_range_with_the_same_id():
    """split_steps: a device task goes with the runtime call that launched it (CUPTI ids), even when it runs
    after the step's end; an annotation's correlation id counts in the host space and must not claim a kernel
    whose id it happens to equal."""
    from kineto_trace import TraceEvent
    from torch._C._autograd import DeviceType

    from opscope.capture.step_writer import STEP_END, split_steps

    def ev(cat, name, ts, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 1, "tid": 1, "args": args}

    op = TraceEvent(ev("cpu_op", "aten::mm", 2, **{"External id": 7}), DeviceType.CPU)
    events = [
        op,                                                                                          # step 1
        TraceEvent(ev("cuda_runtime", "cudaLaunchKernel", 3, correlation=42, **{"External id": 7}),
                   DeviceType.CPU, op),
        TraceEvent(ev("user_annotation", STEP_END, 10, **{"External id": 8}), DeviceType.CPU),
        TraceEvent(ev("user_annotation", "opscope#3", 25, **{"External id": 42}), DeviceType.CPU),    # step 2
        TraceEvent(ev("kernel", "gemm", 30, correlation=42, **{"External id": 7}), DeviceType.CUDA, op),
    ]
    first, second = split_steps(events, 2)
    assert "gemm" in [e.name() for e in first], "the kernel belongs to the step that launched it"
    assert [e.name() for e in second] == ["opscope#3"]
