"""Reports say what a scan can stand on: a failed scan has no verdict, an incomplete one says how
many steps it measured, and no report claims "nothing to change" for a run it did not see."""
from __future__ import annotations

import re

import pytest

from conftest import SCRIPTS, load_scan, run_opscope

CLEAN_CLAIMS = ("Nothing to change", "every operator seen runs on the NPU", "Nothing to fix")


def _scan(tmp_path, script, *script_args):
    proc = run_opscope("scan", SCRIPTS / script, "--steps", "5", "--out", tmp_path, "--format", "html,md,xlsx",
                       "--", *script_args)
    return proc, load_scan(tmp_path)


def _html_headline(out) -> str:
    html = (out / "report.html").read_text(encoding="utf-8")
    line = re.search(r'<p class="verdict-line" id="verdict-line">(.*?)</p>', html, re.S).group(1)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", line)).strip()


def _xlsx_verdict(out) -> str:
    from openpyxl import load_workbook
    rows = {r[0]: r[1] for r in load_workbook(out / "report.xlsx")["Summary"].iter_rows(values_only=True)}
    return rows["verdict"]


@pytest.mark.parametrize("script, args, why", [
    ("crash_at_step3.py", ["--fail-at", "1"], "RuntimeError: bad batch at step 1"),
    ("trains_nothing.py", [], "no training iteration completed"),
])
def test_failed_scan_headlines_say_it_failed_everywhere(tmp_path, script, args, why):
    proc, scan = _scan(tmp_path, script, *args)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert scan["summary"]["readiness_score"] is None
    terminal = proc.stdout
    headline = _html_headline(tmp_path)
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    for text in (terminal, headline, markdown, _xlsx_verdict(tmp_path)):
        assert "Scan failed — no verdict" in text and why in text
        assert not any(claim in text for claim in CLEAN_CLAIMS), text
    assert not re.search(r"\bNone\b", terminal), terminal
    assert "no score (n/a)" in terminal
    assert headline.startswith("n/a Scan failed") and "/100" not in headline
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert not any(claim in html for claim in CLEAN_CLAIMS)


def test_incomplete_scan_says_how_many_steps_it_measured(tmp_path):
    proc, scan = _scan(tmp_path, "exit_nonzero.py")  # one whole step, then sys.exit(2)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert sum(1 for s in scan["steps"] if s["complete"]) == 1
    for text in (proc.stdout, _html_headline(tmp_path), (tmp_path / "report.md").read_text(encoding="utf-8"),
                 _xlsx_verdict(tmp_path)):
        assert "Incomplete — 1 step measured" in text and "exited with status 2" in text
        assert not any(claim in text for claim in CLEAN_CLAIMS), text
    assert not re.search(r"\bNone\b", proc.stdout)
