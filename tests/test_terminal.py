"""The terminal summary: answer first, names never split, piped output not cut at 80 columns."""
from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console

from conftest import ROOT
from opscope.capture.processes import relay_stderr

SUMMARY = ("import json, sys; from opscope.model import ScanResult; from opscope.report.terminal import print_summary; "
           "print_summary(ScanResult.from_dict(json.load(open(sys.argv[1]))))")


def test_piped_summary_answers_first_without_splitting_names(huber_scan):
    proc = subprocess.run([sys.executable, "-c", SUMMARY, str(huber_scan / "scan.json")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) > 80  # a pipe is not an 80-column terminal
    fixes_at = next(i for i, line in enumerate(lines) if "What to change" in line)
    verdict_at = next(i for i, line in enumerate(lines) if line.startswith("On torch_npu"))
    npu_at = next(i for i, line in enumerate(lines) if "by estimated NPU time" in line)
    cpu_at = next(i for i, line in enumerate(lines) if "on this machine" in line)
    assert verdict_at < fixes_at < npu_at < cpu_at   # the first screen's top operators are the NPU estimate
    fix_rows = [line for line in lines[fixes_at:] if line.startswith("│")]
    first = next(line for line in fix_rows if line.split("│")[1].strip() == "1")
    assert "aten::huber_loss" in first and "train_huber.py:29" in first and "smooth_l1_loss" in first
    # one row per blocking operator, however many signatures it has
    fix_table = lines[fixes_at:fixes_at + next(i for i, line in enumerate(lines[fixes_at:]) if line.startswith("└"))]
    assert sum("aten::huber_loss_backward" in line for line in fix_table) == 1
    plan_at = verdict_at + 1   # the port plan, first after the verdict line: huber_loss falls back on every release
    assert lines[plan_at].startswith("Port plan: install torch_npu ")
    assert any("aten::huber_loss_backward runs natively on no release" in line for line in lines[plan_at:fixes_at])
    assert any("'cuda'" in line and "train_huber.py:17" in line for line in fix_rows)
    top = lines[cpu_at:]
    top = top[:next(i for i, line in enumerate(top) if line.startswith("└"))]
    rows = [line for line in top if line.startswith("│")]
    assert rows and not any("not-applicable" in line for line in rows)
    assert any("[64, 20]" in line for line in rows)  # input shapes shown
    assert any("aten::gelu_backward" in line for line in rows)  # the whole name on one line


def test_names_are_cut_with_an_ellipsis_never_folded():
    from opscope.report.terminal import _name_column
    from rich.table import Table
    t = Table()
    _name_column(t, "operator")
    t.add_column("other")
    t.add_row("aten::gelu_backward_with_a_very_long_overload_name", "x " * 30)
    buf = io.StringIO()
    Console(file=buf, width=40).print(t)
    text = buf.getvalue()
    assert "gelu_ba" in text and "ckward" not in text.replace("gelu_backward", "")


def test_kineto_device_count_noise_is_filtered(monkeypatch):
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", type("S", (), {"buffer": out})())
    stream = io.BytesIO(b"ERROR:2026-01-01 10:00:00 123:123 CudaDeviceProperties.cpp:26] gpuGetDeviceCount failed "
                        b"with code 35\nERROR: the script's own error\nTraceback (most recent call last):\n")
    relay_stderr(stream)
    assert out.getvalue() == b"ERROR: the script's own error\nTraceback (most recent call last):\n"


def test_a_narrow_terminal_gets_lists_that_keep_names_and_lines_whole(huber_scan):
    import json

    from opscope.model import ScanResult
    from opscope.report.terminal import print_summary
    buf = io.StringIO()
    print_summary(ScanResult.from_dict(json.loads((huber_scan / "scan.json").read_text())),
                  Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "aten::huber_loss_backward (cpu-fallback) at train_huber.py:29" in text.replace("\n", " ")
    answer = text.split("Top operators")[0]
    assert "…" not in answer and "aten::gelu_backward" in text  # the fixes are never cut
