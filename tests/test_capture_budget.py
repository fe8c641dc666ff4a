"""The capture's memory guard (--max-capture-mb) bounds what opscope holds, not the script's tensors (issue 41)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from conftest import SCRIPTS, run_opscope

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and libc10")


def _steps(out) -> list[dict]:
    return [json.loads(line) for line in (out / "capture" / "steps.jsonl").read_text().splitlines()]


def test_cpu_allocator_bytes_counts_live_tensors_while_memory_is_profiled():
    from opscope.capture.step_writer import CpuAllocatorBytes
    live = CpuAllocatorBytes(torch.__file__)
    assert live.read() is not None
    with torch.autograd.profiler.profile(profile_memory=True, use_kineto=True):
        before = live.read()
        block = torch.empty(2_500_000)   # 10 MB
        assert live.read() - before == 10_000_000
        del block
        assert live.read() == before


def test_the_scripts_tensors_are_not_capture_memory(tmp_path):
    """About 1.3 GB of activations in a step of a hundred calls: recorded whole under a 150 MB budget."""
    proc = run_opscope("scan", SCRIPTS / "capture_budget.py", "--steps", "2", "--out", tmp_path, "--quiet",
                       "--format", "", "--max-capture-mb", "150")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _steps(tmp_path)
    assert len(steps) == 2 and all(s["unrecorded"] == {} for s in steps), [s["unrecorded"] for s in steps]


def test_a_runaway_capture_still_stops(tmp_path):
    """60,000 tiny calls a step: their profiler events are opscope's memory."""
    proc = run_opscope("scan", SCRIPTS / "capture_budget.py", "--steps", "2", "--out", tmp_path, "--quiet",
                       "--format", "", "--max-capture-mb", "150", "--max-step-calls", "1000000",
                       "--", "--batch", "64", "--runaway", "60000", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cut = [s["unrecorded"] for s in _steps(tmp_path) if s["unrecorded"]]
    assert cut and all(u["reason"] == "capture memory above --max-capture-mb 150" for u in cut), cut


def _result(unrecorded: list[dict]):
    from opscope.model import ScanResult, Step
    result = ScanResult(script="train.py", device="cpu", complete=True)
    result.steps = [Step(index=i + 1, unrecorded=u) for i, u in enumerate(unrecorded)]
    return result


def test_a_cut_step_leads_the_headline():
    from opscope.report.headline import measured_steps, verdict_line
    cut = {"after_calls": 1341, "calls": 4210, "reason": "capture memory above --max-capture-mb 1536",
           "where": "train.py:40"}
    result = _result([cut, {}])
    line = verdict_line(result)
    assert line.startswith("Partial steps — recorded in part, step 1: the first 1,341 of 4,210 torch calls (32%) "
                           "(capture memory above --max-capture-mb 1536)."), line
    assert measured_steps(result) == 1


def test_no_score_when_no_step_was_recorded_whole():
    from opscope.analysis.scan_result import no_whole_step_reason
    cut = {"after_calls": 20000, "calls": 31000}
    assert no_whole_step_reason(_result([cut, {}]).steps) is None
    reason = no_whole_step_reason(_result([cut, dict(cut, calls=0)]).steps)
    assert reason.startswith("no step was recorded whole (recorded in part, step 1: the first 20,000 of 31,000 "
                             "torch calls (65%); step 2: the first 20,000 torch calls (--max-step-calls))"), reason
