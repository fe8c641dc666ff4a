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
