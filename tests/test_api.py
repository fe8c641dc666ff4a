"""The notebook API: opscope.load / opscope.load_diff give pandas DataFrames, pandas imported lazily."""
from __future__ import annotations

import subprocess
import sys

import opscope
from conftest import ROOT

LAZY = """
import sys, opscope
run = opscope.load(sys.argv[1])
print("before", "pandas" in sys.modules)
run.operators
print("after", "pandas" in sys.modules)
"""


def test_load_gives_dataframes(huber_scan):
    run = opscope.load(huber_scan)
    ops = run.operators
    assert len(ops) == len(run.result.operators) and {"name", "verdict", "phase", "input_shapes",
                                                      "steady_time_us", "evidence", "source"} <= set(ops.columns)
    by_verdict = ops.groupby("verdict")["calls"].sum()
    assert by_verdict["cpu-fallback"] > 0 and by_verdict["native"] > 0
    huber = ops[ops["name"] == "aten::huber_loss"].iloc[0]
    assert huber["verdict"] == "cpu-fallback" and "smooth_l1_loss" in huber["substitute"]
    assert not ops["evidence"].str.contains("{'").any()  # sentences, not dict reprs
    assert list(run.steps["index"]) == [1, 2, 3] and "forward_us" in run.steps.columns
    assert set(run.findings["severity"]) >= {"error"} and "train_huber.py" in set(run.findings["file"])
    assert run.fixes.iloc[0]["what"].startswith("aten::huber_loss")
    assert run.dynamic_shapes.empty and list(run.dynamic_shapes.columns)[:2] == ["op", "source"]
    assert run.score == run.result.summary.readiness_score


def test_pandas_is_imported_only_for_the_tables(huber_scan):
    proc = subprocess.run([sys.executable, "-c", LAZY, str(huber_scan)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "before False" in proc.stdout and "after True" in proc.stdout


def test_load_diff_of_a_run_with_itself(huber_scan):
    diff = opscope.load_diff(huber_scan, huber_scan)
    ops = diff.operators
    assert len(ops) > 0 and (ops["delta_us"] == 0).all() and set(ops["status"]) == {"same"}
    assert diff.only_a.empty and diff.only_b.empty


def test_scan_from_python_returns_the_result_and_writes_the_run_folder(tmp_path):
    """``opscope.scan(...)`` is ``opscope scan`` as a function: the same run folder, the ``ScanResult`` back."""
    from opscope.model import ScanResult
    out = tmp_path / "cnn"
    result = opscope.scan(ROOT / "examples" / "train_cnn.py", out=out, steps=2, formats=())
    assert isinstance(result, ScanResult) and result.complete and result.operators
    assert (out / "scan.json").is_file() and (out / "operators.csv").is_file() and not (out / "report.html").exists()
    assert result.settings.steps == 2 and opscope.load(out).result.operators == result.operators


def test_scan_from_python_refuses_a_bad_option_as_the_command_does(tmp_path):
    import pytest

    from opscope.errors import UserError
    script = str(ROOT / "examples" / "train_cnn.py")
    with pytest.raises(UserError) as caught:
        opscope.scan(script, out=tmp_path / "x", steps=2, warmup=2, formats=())
    assert caught.value.exit_code == 2
    cli = subprocess.run([sys.executable, "-m", "opscope", "scan", script, "-o", str(tmp_path / "y"), "--steps", "2",
                          "--warmup", "2", "--format", ""], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cli.returncode == 2 and cli.stderr.strip() == f"opscope: error: {caught.value}"
    with pytest.raises(UserError, match="unknown report format pdf"):
        opscope.scan(script, out=tmp_path / "x", formats=("pdf",))
    with pytest.raises(UserError, match="unknown --step-marker 'epoch': choose from auto, optimizer, backward, module"):
        opscope.scan(script, out=tmp_path / "x", step_marker="epoch")   # the parser's choices, as the parser says it
    with pytest.raises(TypeError, match="no_traces"):
        opscope.scan(script, no_traces=True)
