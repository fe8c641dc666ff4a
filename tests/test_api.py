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
