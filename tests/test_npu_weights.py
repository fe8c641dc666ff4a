"""The readiness score and its shares weigh the estimated NPU time, so identical scans score identically."""
from __future__ import annotations

import subprocess
import sys

from conftest import EXAMPLES, load_scan, run_opscope
from opscope.analysis.npu.weights import assign_npu_times
from opscope.model import NpuEstimate, Operator


def test_weights_come_from_the_estimate_rows_and_never_from_the_clock():
    ops = [Operator(name="aten::mm", overload=None, input_shapes=[[4, 4], [4, 4]], dtypes=["float", "float"],
                    phase="forward", source="t.py:3", self_time_us=999.0),
           Operator(name="aten::huber_loss", overload=None, input_shapes=[[4]], dtypes=["float"], phase="forward",
                    source="t.py:4", self_time_us=5.0, verdict="cpu-fallback"),
           Operator(name="aten::empty", overload=None, phase="other", source="t.py:1", self_time_us=50.0)]
    estimate = NpuEstimate.from_dict({"rows": [
        {"kind": "operator", "operator": "aten::mm", "input_shapes": [[4, 4], [4, 4]], "dtypes": ["float", "float"],
         "phase": "forward", "source": "t.py:3", "npu_time_us": 12.0, "host_us": 127.0, "weight_us": 12.0},
        {"kind": "operator", "operator": "aten::huber_loss", "input_shapes": [[4]], "dtypes": ["float"],
         "phase": "forward", "source": "t.py:4", "npu_time_us": 0.0, "host_us": 300.0, "weight_us": 45.0},
        {"kind": "pattern", "operator": "fused thing", "npu_time_us": 7.0}]})
    assert assign_npu_times(ops, estimate)
    assert [op.npu_time_us for op in ops] == [12.0, 45.0, 0.0]   # the fallback: its copies and sync, no CPU time
    assert not assign_npu_times(ops, None) and ops[0].npu_time_us is None   # no estimate: measured time again


def test_identical_scans_score_identically_on_a_loaded_machine(tmp_path):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        summaries = []
        for i in range(3):
            out = tmp_path / f"run{i}"
            proc = run_opscope("scan", EXAMPLES / "train_huber.py", "--steps", "3", "--out", out, "--quiet",
                               "--format", "", "--target", "2.14.0")
            assert proc.returncode == 0, proc.stderr[-2000:]
            summaries.append(load_scan(out)["summary"])
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert len({s["readiness_score"] for s in summaries}) == 1
    assert len({s["blocking_time_share"] for s in summaries}) == 1
    assert len({tuple(sorted(s["time_share"].items())) for s in summaries}) == 1
    assert summaries[0]["time_basis"].startswith("estimated NPU time per step")
