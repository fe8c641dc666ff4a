"""The XLSX workbook re-read with openpyxl, and opened by LibreOffice where installed."""
from __future__ import annotations

import csv
import shutil
import subprocess

import openpyxl
import pytest

from opscope.report import view
from opscope.report.xlsx import write_xlsx
from test_report_fixtures import EVIL, realistic_scan

SHEETS = ["Fixes", "Summary", "Operators", "Not supported", "Dynamic shapes", "Findings", "Substitutes"]


@pytest.fixture(scope="module")
def workbook_path(tmp_path_factory):
    return write_xlsx(realistic_scan(evil=True), tmp_path_factory.mktemp("xlsx") / "report.xlsx")


@pytest.fixture(scope="module")
def wb(workbook_path):
    return openpyxl.load_workbook(workbook_path)


def _header(ws):
    return [c.value for c in ws[1]]


def test_sheets_headers_frozen_and_filtered(wb):
    assert wb.sheetnames == SHEETS
    for ws in wb.worksheets:
        assert ws.freeze_panes == "A2", ws.title
        assert ws.auto_filter.ref and ws.auto_filter.ref.startswith("A1:"), ws.title
        assert all(c.font.bold for c in ws[1]), ws.title
        widths = [ws.column_dimensions[c.column_letter].width for c in ws[1]]
        assert all(8 <= w <= 62 for w in widths), (ws.title, widths)
    assert _header(wb["Operators"])[:3] == ["operator", "verdict", "calls"]


def test_operators_numbers_are_numbers_and_verdicts_coloured(wb):
    ws = wb["Operators"]
    head = _header(ws)
    rows = [dict(zip(head, (c for c in r))) for r in ws.iter_rows(min_row=2)]
    assert len(rows) == 10
    conv = next(r for r in rows if r["operator"].value == "aten::conv2d")
    assert conv["calls"].value == 60 and isinstance(conv["time ms"].value, (int, float))
    assert conv["time ms"].value == pytest.approx(120.0)
    assert 0 < conv["time share"].value < 1 and conv["time share"].number_format == "0.0%"
    assert conv["verdict"].fill.fgColor.rgb.endswith("C8E6C9")
    assert next(r for r in rows if r["operator"].value == "torchvision::roi_align")["verdict"].fill.fgColor.rgb.endswith("FFCDD2")


def test_not_supported_sheet_holds_only_blocking_verdicts(wb):
    verdicts = {r[1] for r in wb["Not supported"].iter_rows(min_row=2, values_only=True)}
    assert verdicts == {"cpu-fallback", "unsupported", "unknown"}
    dyn = list(wb["Dynamic shapes"].iter_rows(min_row=2, values_only=True))
    assert dyn[0][:3] == ("root cause", "train.py:50", "data-dependent-output")
    findings = list(wb["Findings"].iter_rows(min_row=2, values_only=True))
    assert ("error", "/home/me/proj/train.py", 70) == findings[1][:3]
    subs = [r[0] for r in wb["Substitutes"].iter_rows(min_row=2, values_only=True)]
    assert "aten::huber_loss" in subs and "aten::_unique2" in subs


def test_user_data_never_becomes_a_formula(wb):
    texts = {}
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (ws.title, cell.coordinate, cell.value)
                if isinstance(cell.value, str):
                    texts[cell.value] = cell
    for value in ('=HYPERLINK("http://evil","x") (+1-1)', "@SUM(A1:A3)", "=1+1", "-float"):
        assert value in texts, value
        assert texts[value].data_type == "s" and texts[value].quotePrefix
    assert EVIL in texts


def test_summary_sheet(wb):
    items = {r[0]: r[1:] for r in wb["Summary"].iter_rows(min_row=2, values_only=True)}
    assert items["readiness score (0-100)"][0] == 72.5
    assert items["verdict: native"][0] == 4 and isinstance(items["verdict: native"][1], float)
    assert items["target"][0] == "torch_npu 2.6.0 (op_plugin)"
    assert any(k.startswith("fix 1:") for k in items)


def _soffice():
    return shutil.which("libreoffice") or shutil.which("soffice")


@pytest.mark.skipif(not _soffice(), reason="LibreOffice not installed (apt-get install -y libreoffice-calc-nogui)")
def test_libreoffice_converts_the_workbook(workbook_path, tmp_path):
    out = tmp_path / "out"
    profile = tmp_path / "lo-profile"
    proc = subprocess.run(
        [_soffice(), f"-env:UserInstallation=file://{profile}", "--headless", "--convert-to",
         "csv:Text - txt - csv (StarCalc):44,34,76,1,,0,false,true,false,false,false,-1",  # every sheet
         "--outdir", str(out), str(workbook_path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    files = {p.name: p for p in out.glob("*.csv")}
    assert "report-Operators.csv" in files, (files, proc.stdout, proc.stderr)
    rows = list(csv.reader(files["report-Operators.csv"].open(encoding="utf-8")))
    assert rows[0][:3] == ["operator", "verdict", "calls"]
    cells = {c for r in rows for c in r}
    # the formula-looking text survived as text: LibreOffice did not evaluate it
    assert "@SUM(A1:A3)" in cells and "=1+1" in cells and EVIL in cells


def test_fixes_sheet_comes_first_in_the_html_order(wb):
    ws = wb.worksheets[0]
    assert ws.title == "Fixes"
    rows = list(ws.iter_rows(min_row=2, values_only=True))
    expected = view.top_fixes(realistic_scan(evil=True), limit=None)
    assert [r[3] for r in rows] == [f.what for f in expected]  # same order as the HTML list
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    shares = [r[5] for r in rows if r[5] is not None]
    assert shares and all(isinstance(s, float) for s in shares)  # numbers stay numbers
    assert all(not str(r[6]).startswith("{") for r in rows)
