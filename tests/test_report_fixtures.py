"""Realistic ScanResult fixtures for the report tests (a CNN + Huber loss run on CPU).

Built by hand so the report tests do not depend on the scan pipeline, yet look like
what `opscope scan` writes: conv/linear/huber ops, a CPU fallback, an unsupported op,
a dynamic op with a root cause, static and runtime CUDA findings.
"""
from __future__ import annotations

from opscope.model import DynamicShape, Finding, Operator, RootCause, ScanResult, Step

EVIL = "<script>window.__pwned=1</script>"


def op(name, verdict, shapes, dtypes, calls, self_us, phase="forward", source="train.py:42", **kw):
    return Operator(name=name, input_shapes=shapes, dtypes=dtypes, calls=calls, self_time_us=self_us,
                    total_time_us=self_us * 1.2, phase=phase, phases=[phase], source=source,
                    sources=[source], steps=[1, 2, 3], verdict=verdict, **kw)


def realistic_scan(evil: bool = False) -> ScanResult:
    """A scan of a small CNN; with ``evil`` user-controlled strings carry HTML and formulas."""
    script = "/home/me/proj/train.py"
    ops = [
        op("aten::conv2d", "native", [[32, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []],
           ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"], 60, 120_000,
           source="train.py:21", evidence={"list": "op_plugin", "version": "2.6.0", "rule": "aten-listed"}),
        op("aten::convolution_backward", "native", [[32, 16, 32, 32], [32, 3, 32, 32], [16, 3, 3, 3]],
           ["float", "float", "float"], 60, 200_000, phase="backward", source="train.py:21",
           evidence={"list": "op_plugin", "version": "2.6.0"}),
        op("aten::addmm", "native", [[10], [32, 4096], [4096, 10], [], []],
           ["float", "float", "float", "Scalar", "Scalar"], 60, 30_000, source="train.py:24"),
        op("aten::huber_loss", "composite", [[32, 10], [32, 10], [], []], ["float", "float", "long int", "Scalar"],
           60, 9_000, source="train.py:40",
           evidence={"list": "op_plugin", "version": "2.6.0", "rule": "decomposes",
                     "path": ["aten::huber_loss", "aten::sub", "aten::abs", "aten::where"]},
           substitute={"replacement": "torch.nn.functional.smooth_l1_loss", "rationale": "fused on NPU"}),
        op("aten::_unique2", "cpu-fallback", [[32]], ["long int"], 30, 50_000, source="train.py:55",
           evidence={"list": "op_plugin", "rule": "aicpu"},
           substitute={"replacement": "precompute the label set on the host", "rationale": "AI CPU op"}),
        op("torchvision::roi_align", "unsupported", [[32, 16, 8, 8], [5, 5]], ["float", "float"], 30, 40_000,
           source="train.py:33", evidence={"list": "op_plugin", "version": "2.6.0", "rule": "absent"}),
        op("aten::nonzero", "unknown", [[32]], ["bool"], 30, 5_000, source="train.py:50", dynamic=True),
        op("aten::add_", "native", [[16], [16], []], ["float", "float", "Scalar"], 60, 3_000, phase="optimizer",
           source="train.py:60"),
    ]
    if evil:
        ops.append(op(EVIL, "unsupported", [[1]], [EVIL], 3, 90_000, source=f"{EVIL}.py:1",
                      substitute={"replacement": "=HYPERLINK(\"http://evil\",\"x\")", "rationale": "+1-1"}))
        ops.append(op("@SUM(A1:A3)", "cpu-fallback", [[2]], ["-float"], 1, 10, source="=1+1"))
    dyn = DynamicShape(op="aten::nonzero", source="train.py:50", cause="data-dependent-output",
                       varying_dims=[{"arg": 0, "dim": 0, "values": [32, 8]}],
                       shapes_per_step={"1": [[[32]]], "2": [[[32]]], "3": [[[8]]]},
                       root_cause="train.py:50", suggestion="use torch.where with a fixed-size mask")
    rc = RootCause(source="train.py:50", cause="data-dependent-output", ops=["aten::nonzero", "aten::index"],
                   varying_dims=dyn.varying_dims, suggestion="use torch.where with a fixed-size mask",
                   evidence="output size of aten::nonzero depends on the data")
    findings = [
        Finding(rule="cuda-device", file=script, line=12, api="torch.cuda.is_available", message="CUDA-only API",
                replacement="torch.npu.is_available", severity="warning", origin="static", snippet="if torch.cuda.is_available():"),
        Finding(rule="nccl-backend", file=script, line=70, api="dist.init_process_group(backend='nccl')",
                message="NCCL is not available on Ascend", replacement="backend='hccl'", severity="error"),
    ]
    if evil:
        findings.append(Finding(rule="cuda-amp", file=f"/tmp/{EVIL}.py", line=3, api=EVIL, message=EVIL,
                                replacement="=cmd|' /C calc'!A0", severity="info", origin="runtime"))
    steps = [Step(index=i, duration_us=160_000, op_calls=400,
                  phase_time_us={"forward": 60_000, "backward": 80_000, "optimizer": 10_000, "other": 10_000})
             for i in (1, 2, 3)]
    return ScanResult(
        script=script if not evil else f"/tmp/{EVIL}/train.py", argv=["--epochs", "1"] + ([EVIL] if evil else []),
        device="cpu", torch_version="2.13.0", complete=True, tool_version="0.1.0", python_version="3.11.9",
        platform="Linux", cwd="/home/me/proj", started_at="2025-01-01T10:00:00", duration_s=12.5,
        settings={"steps": 3, "warmup": 0, "requested_device": "cpu"},
        exit={"kind": "steps-reached", "code": 0, "message": ""}, steps=steps, operators=ops,
        dynamic_shapes=[dyn], root_causes=[rc], findings=findings,
        summary={"readiness_score": 72.5}, target={"package": "torch_npu", "version": "2.6.0", "source": "op_plugin"},
        notes=[EVIL] if evil else ["captured 3 steps"])


def test_fixture_round_trips_through_scan_json():
    """The fixture is a valid scan: what report tests render is what scan.json can hold."""
    import json
    scan = realistic_scan(evil=True)
    again = ScanResult.from_dict(json.loads(json.dumps(scan.to_dict())))
    assert again.to_dict() == scan.to_dict()
    assert {o.verdict for o in again.operators} >= {"native", "composite", "cpu-fallback", "unsupported", "unknown"}
