"""Take the docs' report screenshot from the bundled example's report, and record what it shows.

    python docs/hooks/screenshots.py            # scan examples/train_cnn.py, render, screenshot
    python docs/hooks/screenshots.py --check    # exit 1 when the screenshot is stale

Writes ``docs/images/report-screenshot.png`` (the report's first screen, as a reader opens it) and
``docs/images/report-screenshot.json``: the report's sections, in order, when the picture was taken.
``tests/test_docs.py`` renders the same report and compares its sections with that list, so a report that
gains, loses or reorders a section fails CI until the picture is taken again.  Needs Debian's chromium
and playwright (both installed by ``.ci/run``); the scan runs on the CPU stand-in.
"""
from __future__ import annotations

import argparse
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PICTURE = ROOT / "docs" / "images" / "report-screenshot.png"
RECORD = PICTURE.with_suffix(".json")
SCAN = ["examples/train_cnn.py", "--steps", "5", "--format", "html", "--quiet"]   # then --out DIR -- ARGS
SCRIPT_ARGS = ["--epochs", "1"]
VIEWPORT = {"width": 1280, "height": 900}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


class _Headings(html.parser.HTMLParser):
    """The text of every ``<h2>`` of a report, in order: its sections."""

    def __init__(self):
        super().__init__()
        self.sections: list[str] = []
        self._open = False

    def handle_starttag(self, tag, attrs):
        if tag == "h2":
            self._open = True
            self.sections.append("")

    def handle_endtag(self, tag):
        if tag == "h2":
            self._open = False
            self.sections[-1] = " ".join(self.sections[-1].split())

    def handle_data(self, data):
        if self._open:
            self.sections[-1] += data


def report_sections(report_html: str) -> list[str]:
    """The report's section headings, with the chip's and run's own words ("on Ascend910B2") kept."""
    parser = _Headings()
    parser.feed(report_html)
    return parser.sections


def _scan(out: Path) -> Path:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")   # the stand-in, as the docs' first scan
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", *SCAN, "--out", str(out), "--", *SCRIPT_ARGS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"screenshots: the scan failed (exit {proc.returncode}): {proc.stderr[-1000:]}")
    return out / "report.html"


def _screenshot(report: Path, picture: Path) -> None:
    from playwright.sync_api import sync_playwright
    chromium = os.environ.get("OPSCOPE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("#ops tbody tr")
        page.screenshot(path=str(picture))   # the first screen: what a reader sees on opening it
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the screenshot is current")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="opscope-docs-") as tmp:
        report = _scan(Path(tmp) / "cnn")
        sections = report_sections(report.read_text(encoding="utf-8"))
        if args.check:
            recorded = json.loads(RECORD.read_text(encoding="utf-8"))["sections"]
            if recorded != sections:
                print(f"stale: the report's sections are now {sections}, the screenshot shows {recorded}")
                return 1
            print("current")
            return 0
        _screenshot(report, PICTURE)
    RECORD.write_text(json.dumps({"sections": sections, "viewport": VIEWPORT, "scan": [*SCAN, "--", *SCRIPT_ARGS],
                                  "taken_with": "python docs/hooks/screenshots.py"}, indent=1) + "\n",
                      encoding="utf-8")
    print(f"wrote {PICTURE.relative_to(ROOT)} and {RECORD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
