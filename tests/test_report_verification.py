"""Verification section (HTML) and sheets (XLSX) for a scan that `opscope verify` has run on."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openpyxl
import pytest

from opscope.model import Verification
from opscope.report.html import render_html
from opscope.report.markdown import render_markdown
from opscope.report.xlsx import build_workbook
from test_report_fixtures import EVIL, realistic_scan

REPO = Path(__file__).resolve().parents[1]


def _result(outcome, op, overload, shapes, dtypes, cosine=None, abs_err=None, rel_err=None, standard=None,
            message="", predicted="native", disagreement=None):
    metrics = {} if cosine is None else {"cosine": cosine, "max_abs_err": abs_err, "max_rel_err": rel_err,
                                          "ratio_rel_err_lt_0_001": 0.99, "ratio_rel_err_lt_0_005": 1.0}
    return {"op": op, "overload": overload, "input_shapes": shapes, "dtypes": dtypes, "outcome": outcome,
            "metrics": metrics, "standard": standard, "message": message, "predicted_verdict": predicted,
            "disagreement": disagreement, "seconds": 0.01}


def verified_scan(evil: bool = False):
    """The CNN fixture after `opscope verify --device npu --e2e`: every outcome and an e2e fail."""
    results = [
        _result("pass", "aten::conv2d", "", [[32, 3, 32, 32], [16, 3, 3, 3]], ["float", "float"],
                0.99999, 1.2e-6, 3.4e-4, "benchmark"),
        _result("skipped", "aten::nonzero", "", [[32]], ["bool"], message="data-dependent output shape"),
        _result("warn", "aten::huber_loss", "", [[32, 10], [32, 10]], ["float", "float"], 0.9998, 2e-3, 8e-3,
                "benchmark", "max_rel_err 1.3x the CPU reference"),
        _result("fail", "aten::_unique2", "", [[32]], ["long int"], 0.41, 7.0, float("inf"), "absolute",
                "outputs differ from the float64 oracle", predicted="cpu-fallback"),
        _result("error", "torchvision::roi_align", "default", [[32, 16, 8, 8], [5, 5]], ["float", "float"],
                message="RuntimeError: op not implemented for PrivateUse1", predicted="native",
                disagreement="predicted native but the op raised on the device"),
        _result("pass", "aten::addmm", "default", [[10], [32, 4096], [4096, 10]], ["float"] * 3,
                1.0, 1e-7, 1e-6, "benchmark"),
    ]
    if evil:
        results.append(_result("fail", EVIL, "=1+1", [[1]], [EVIL], 0.1, 1.0, 1.0, "absolute", EVIL,
                               predicted="unsupported", disagreement="@SUM(A1:A2)"))
    counts = {"pass": 2, "warn": 1, "fail": 1 + int(evil), "error": 1, "skipped": 1,
              "total": len(results), "disagreements": 1 + int(evil)}
    loss = {"steps": [{"step": 1, "reference": 2.3026, "candidate": 2.3026, "abs_diff": 0.0, "rel_diff": 0.0, "ok": True},
                      {"step": 2, "reference": 2.1, "candidate": 2.4, "abs_diff": 0.3, "rel_diff": 0.142857, "ok": False}],
            "first_divergent_step": 2, "within_tolerance": False}
    grads = {"steps": [{"step": 1, "reference": 1.5, "candidate": 1.5, "abs_diff": 0.0, "rel_diff": 0.0, "ok": True},
                       {"step": 2, "reference": 1.4, "candidate": 1.9, "abs_diff": 0.5, "rel_diff": 0.36, "ok": False}],
             "first_divergent_step": 2, "within_tolerance": False}
    e2e = {"reference_device": "cpu", "candidate": "npu", "steps": 2, "seed": 0,
           "comparison": {"verdict": "fail", "message": EVIL if evil else "loss differs from step 2: 2.4 vs 2.1",
                          "rtol": 0.01, "atol": 0.001, "loss": loss, "grad_norm": grads}}
    scan = realistic_scan(evil=evil)
    scan.verification = Verification.from_dict({"device": "npu", "started_at": "2025-01-01T11:00:00",
                                                "duration_s": 4.2, "inputs": "synthetic", "seed": 0,
                                                "reference": "CPU float64", "standards": "msprobe", "counts": counts,
                                                "results": results, "e2e": e2e})
    return scan


def _section(html: str) -> str:
    start = html.index('<section id="verification">')
    return html[start:html.index("</section>", start)]


def test_html_section_counts_worst_first_and_e2e():
    html = render_html(verified_scan(), charts={})
    assert '<a href="#verification">Verification</a>' in html
    section = _section(html)
    for outcome, n in {"pass": 2, "warn": 1, "fail": 1, "error": 1, "skipped": 1}.items():
        assert (f'<div class="card" data-outcome="{outcome}"><div class="value o-text-{outcome}">{n}</div>'
                in section), outcome
    order = [line.split('data-outcome="')[1].split('"')[0] for line in section.splitlines()
             if line.strip().startswith("<tr data-outcome=")]
    assert order == ["fail", "error", "warn", "pass", "pass", "skipped"]
    assert "roi_align" in section and "predicted native but the op raised" in section
    assert section.index("_unique2") < section.index("aten::conv2d") < section.index("aten::nonzero")
    assert "0.41" in section and ">inf<" in section  # a non-finite error is shown, not dropped
    assert 'id="e2e-losses"' in section and '<span class="badge o-fail">fail</span> loss differs from step 2' in section
    assert section.count('<span class="badge o-fail">no</span>') == 1


def test_html_has_no_verification_section_when_not_verified():
    html = render_html(realistic_scan(), charts={})
    assert 'id="verification"' not in html and "#verification" not in html


def test_html_escapes_user_strings_in_verification():
    section = _section(render_html(verified_scan(evil=True), charts={}))
    assert "<script>window" not in section
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in section


def test_xlsx_verification_sheet_numbers_fills_and_no_formulas(tmp_path):
    path = tmp_path / "report.xlsx"
    build_workbook(verified_scan(evil=True)).save(path)
    wb = openpyxl.load_workbook(path)
    assert wb.sheetnames[-2:] == ["Verification", "E2E losses"]
    ws = wb["Verification"]
    assert ws.freeze_panes == "A2" and ws.auto_filter.ref.startswith("A1:L")
    head = [c.value for c in ws[1]]
    assert head[:5] == ["operator", "overload", "input shapes", "dtypes", "outcome"]
    rows = [dict(zip(head, r)) for r in ws.iter_rows(min_row=2)]
    assert [r["outcome"].value for r in rows] == ["fail", "fail", "error", "warn", "pass", "pass", "skipped"]
    conv = next(r for r in rows if r["operator"].value == "aten::conv2d")
    assert conv["cosine"].value == pytest.approx(0.99999) and isinstance(conv["max abs err"].value, float)
    assert conv["outcome"].fill.fgColor.rgb.endswith("C8E6C9")
    assert rows[0]["outcome"].fill.fgColor.rgb.endswith("FFCDD2")
    assert next(r for r in rows if r["operator"].value == "aten::nonzero")["cosine"].value is None
    assert next(r for r in rows if r["operator"].value == "aten::_unique2")["max rel err"].value == "inf"
    evil = next(r for r in rows if r["operator"].value == EVIL)
    assert evil["overload"].value == "=1+1" and evil["overload"].data_type == "s"
    assert evil["disagreement"].value == "@SUM(A1:A2)" and evil["disagreement"].data_type == "s"
    for row in ws.iter_rows():
        assert all(c.data_type != "f" for c in row)
    summary = {r[0]: r[1] for r in wb["Summary"].iter_rows(min_row=2, values_only=True)}
    assert [summary[f"verification: {o}"] for o in ("pass", "warn", "fail", "error", "skipped")] == [2, 1, 2, 1, 1]
    assert summary["verification device"] == "npu"
    e2e = list(wb["E2E losses"].iter_rows(min_row=2, values_only=True))
    assert e2e[1][:3] == (2, 2.1, 2.4) and e2e[1][-1] == "no"
    assert e2e[-1][0] == "verdict: fail"


def test_xlsx_has_no_verification_sheet_when_not_verified():
    assert "Verification" not in build_workbook(realistic_scan()).sheetnames


def test_markdown_lists_failing_signatures():
    md = render_markdown(verified_scan(evil=True))
    assert "## Verification" in md and "| fail | 2 |" in md
    assert "aten::_unique2" in md and "<script>" not in md


def _opscope(*args, cwd=REPO):
    done = subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


def test_scan_verify_report_end_to_end(tmp_path):
    run = tmp_path / "run"
    _opscope("scan", "examples/train_huber.py", "--steps", "2", "--out", run, "--format", "")
    _opscope("verify", run, "--device", "cpu", "--quiet")
    _opscope("report", run, "--format", "html,xlsx")
    counts = json.loads((run / "scan.json").read_text())["verification"]["counts"]
    outcomes_all = ("pass", "warn", "fail", "error", "measured", "skipped")
    # --device cpu judges nothing (no self-comparison pass): CPU numerics are measured
    assert counts["pass"] == 0 and counts["measured"] > 0
    assert counts["total"] == sum(counts[o] for o in outcomes_all)

    section = _section((run / "report.html").read_text(encoding="utf-8"))
    for outcome in outcomes_all:
        assert f'data-outcome="{outcome}"><div class="value o-text-{outcome}">{counts[outcome]}</div>' in section
    assert section.count("<tr data-outcome=") == counts["total"]

    wb = openpyxl.load_workbook(run / "report.xlsx")
    outcomes = [r[4] for r in wb["Verification"].iter_rows(min_row=2, values_only=True)]
    assert len(outcomes) == counts["total"]
    assert {o: outcomes.count(o) for o in set(outcomes)} == {o: n for o, n in counts.items()
                                                               if o in outcomes_all and n}
    summary = {r[0]: r[1] for r in wb["Summary"].iter_rows(min_row=2, values_only=True)}
    assert summary["verification: pass"] == counts["pass"]
