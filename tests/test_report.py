"""HTML / Markdown rendering, write_reports and `opscope report` (no browser needed)."""
from __future__ import annotations

import json
import re

import pytest

from opscope.cli import main
from opscope.model import ScanResult
from opscope.report import view
from opscope.report.html import render_html
from opscope.report.markdown import render_markdown
from opscope.report.render import parse_formats, write_reports
from test_report_fixtures import EVIL, realistic_scan


@pytest.fixture(scope="module")
def evil_html():
    return render_html(realistic_scan(evil=True))


def _op_payload(html: str) -> dict:
    blob = re.search(r'<script type="application/json" id="op-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(blob)


def test_html_is_self_contained(evil_html):
    assert "<style>" in evil_html and "JSON.parse" in evil_html
    # no external resource of any kind: scripts, styles, images are inline / data URIs
    assert not re.search(r'(src|href)="(https?:)?//', evil_html)
    assert "<link" not in evil_html
    images = re.findall(r'<img [^>]*src="([^"]+)"', evil_html)
    assert len(images) == 2 and all(uri.startswith("data:image/svg+xml;base64,") for uri in images)  # phase, dynamic


def test_user_strings_render_as_text_never_markup(evil_html):
    # exactly two script elements: the JSON data block and the inline table code
    assert len(re.findall(r"<script\b", evil_html)) == 2
    assert EVIL not in evil_html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in evil_html  # path, argv, notes, findings
    payload = _op_payload(evil_html)
    names = [row[0] for row in payload["rows"]]
    assert EVIL in names  # survives JSON.parse intact, and is filled in with textContent by report.js
    assert "textContent" in evil_html and "innerHTML" not in evil_html


def test_summary_shows_score_counts_target_and_metadata():
    html = render_html(realistic_scan(), charts={})
    assert 'id="readiness-score">72<' in html and 'id="no-verdicts"' not in html
    assert "torch_npu 2.6.0 (op_plugin)" in html
    assert "/home/me/proj/train.py" in html and "--epochs 1" in html and "2.13.0" in html
    verdict_rows = re.findall(r'data-filter-verdict="([a-z-]+)".*?<td class="num">(\d+)</td>', html, re.S)
    assert dict(verdict_rows)["native"] == "4" and dict(verdict_rows)["cpu-fallback"] == "1"
    assert "train.py:50" in html and "use torch.where with a fixed-size mask" in html  # root cause
    assert "torch.npu.is_available" in html and "backend=&#39;hccl&#39;" in html  # findings


def test_operator_rows_carry_every_column_most_expensive_first():
    payload = _op_payload(render_html(realistic_scan(), charts={}))
    keys = [c["key"] for c in payload["columns"]]
    rows = [dict(zip(keys, r)) for r in payload["rows"]]
    assert rows[0]["name"] == "aten::convolution_backward" and rows[0]["phase"] == "backward"
    huber = next(r for r in rows if r["name"] == "aten::huber_loss")
    assert huber["verdict"] == "composite" and "smooth_l1_loss" in huber["substitute"]
    assert "aten::sub -> aten::abs" in huber["evidence"] and huber["shapes"] == "[32, 10], [32, 10], [], []"
    assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-4)


def test_top_fixes_are_ordered_by_impact():
    fixes = view.top_fixes(realistic_scan())
    assert [f.what for f in fixes[:2]] == ["aten::_unique2 (cpu-fallback)", "torchvision::roi_align (unsupported)"]
    shares = [f.share for f in fixes if f.share is not None]
    assert shares == sorted(shares, reverse=True)
    assert {f.kind for f in fixes} == {"operator", "dynamic shape", "CUDA API"}


def test_a_bare_scan_renders_na_instead_of_crashing():
    """An early / partial scan.json: no verdicts, no summary, no target, not complete."""
    bare = ScanResult.from_dict({"schema": "opscope.scan/1", "complete": False,
                                 "incomplete_reason": "script raised ValueError",
                                 "operators": [{"name": "aten::mm", "calls": 2}]})
    html = render_html(bare)
    assert 'id="readiness-score">n/a<' in html and "incomplete" in html and "script raised ValueError" in html
    assert _op_payload(html)["rows"][0][1] == "unknown"
    assert 'id="no-verdicts"' in html and view.top_fixes(bare) == []  # missing verdicts are not findings
    md = render_markdown(bare)
    assert "n/a" in md and "Incomplete scan" in md


def test_markdown_escapes_tables():
    md = render_markdown(realistic_scan(evil=True))
    assert "<script>" not in md
    assert "| torchvision::roi_align | unsupported |" in md
    for line in md.splitlines():
        if line.startswith("| "):
            assert line.count(" | ") - line.count("\\|") >= 1


def test_write_reports_writes_each_format(tmp_path):
    paths = write_reports(realistic_scan(), tmp_path / "run", ("html", "xlsx", "json", "md"))
    assert [p.name for p in paths] == ["report.html", "report.xlsx", "scan.json", "report.md"]
    assert ScanResult.from_dict(json.loads((tmp_path / "run" / "scan.json").read_text())).operators
    assert parse_formats(" HTML,md,html ") == ("html", "md")
    with pytest.raises(ValueError, match="pdf"):
        parse_formats("html,pdf")


def test_report_command_rerenders_a_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json",))
    assert main(["report", str(run_dir), "--format", "html,md"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(run_dir / "report.html"), str(run_dir / "report.md")]
    assert "torchvision::roi_align" in (run_dir / "report.md").read_text()


@pytest.mark.parametrize("content, message", [
    (None, "no scan.json"),
    ("{not json", "not valid JSON"),
    ('{"hello": 1}', "not an opscope scan"),
    ('{"schema": "opscope.scan/1", "operators": [{"nom": 1}]}', "corrupt"),
])
def test_report_command_bad_input_is_one_line(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "scan.json").write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opscope: error:") and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_report_command_rejects_unknown_format(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:  # argparse rejects it before anything is read
        main(["report", str(tmp_path), "--format", "pdf"])
    assert info.value.code == 2
    assert "--format" in capsys.readouterr().err


def test_charts_cope_with_rank_changes_and_odd_dims():
    """Real scans record rank changes as {"dim": null, "what": "rank"}; charts and tables must cope."""
    from opscope.model import DynamicShape
    from opscope.report import charts

    scan = realistic_scan()
    scan.dynamic_shapes.append(DynamicShape(
        op="aten::view", source="train.py:31", cause="input-varies",
        varying_dims=[{"arg": 0, "dim": None, "values": [2, 3], "what": "rank"}],
        shapes_per_step={"1": [[[16, 22], []]], "2": [[[16, 23, 32], []]]}))
    scan.dynamic_shapes.append(DynamicShape(op="aten::odd", source=None, cause="host-sync",
                                            varying_dims=[{"arg": "x"}], shapes_per_step={"one": None, "2": None}))
    uri = charts.dynamic_shapes_per_step(scan)
    assert uri.startswith("data:image/svg+xml;base64,")
    import base64
    svg = base64.b64decode(uri.split(",", 1)[1]).decode()
    assert "<svg" in svg
    html = render_html(scan, charts={})
    assert "arg0.rank: 2, 3" in html and "arg0.dim0: 32, 8" in html
