"""The documentation: what it shows still works.

* README stays short (at most 200 lines) and its links lead to files that exist;
* every shell command in a ```sh block of the README and of the Getting-started pages is either run
  here (the ``opscope`` ones, in document order, in a scratch folder holding the bundled examples) or is
  a command ``.ci/run`` runs (set-up, tests, the docs build); the ```text block shown after a command is
  its output, and each line of it still appears (numbers may differ, ``…`` marks what the page left out);
* the site builds with warnings as errors (``mkdocs build --strict``: broken links and missing pages fail);
* the commands reference is generated from the parser, and the glossary covers every verdict and
  root-cause kind, in the docs and in the HTML report.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT

RUN_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "getting-started").glob("*.md"))]
HOOK = ROOT / "docs" / "hooks" / "opscope_docs.py"
NUMBER = r"\d+(?:[.,]\d+)*"


def _hook():
    spec = importlib.util.spec_from_file_location("opscope_docs", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shell_examples(text: str) -> list[tuple[str, str | None]]:
    """(command, the output shown after it or None) for each command line of the ```sh blocks."""
    found: list[tuple[str, str | None]] = []
    blocks = list(re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, re.S | re.M))
    for i, block in enumerate(blocks):
        if block.group(1) != "sh":
            continue
        lines = [line for line in block.group(2).splitlines() if line.strip() and not line.lstrip().startswith("#")]
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        shown = None
        # the output: the ```text block right after, or after a paragraph introducing it (no heading between)
        if nxt is not None and nxt.group(1) == "text" and "\n#" not in text[block.end():nxt.start()]:
            shown = nxt.group(2)
        found += [(line.strip(), shown if k == len(lines) - 1 else None) for k, line in enumerate(lines)]
    return found


def line_pattern(line: str) -> str:
    """A shown output line as a pattern: numbers may differ, spaces may widen, '…' stands for anything."""
    def loose(part: str) -> str:
        out = []
        for token in re.split(rf"({NUMBER}|\s+)", part):
            if not token:
                continue
            out.append(r"[ \t]+" if token.isspace() else NUMBER if re.fullmatch(NUMBER, token) else re.escape(token))
        return "".join(out)
    return ".*?".join(loose(part.strip()) for part in line.strip().split("…"))


def unmarked_gaps(shown: str, output: str) -> list[str]:
    """Where the shown output skips lines of the real one (or shows them out of order) with no ``…`` line there.

    Each shown line is matched to the first output line after the previous match; two shown lines in a row
    must match output lines in a row (blank output lines aside), unless a line of its own ``…`` stands between.
    """
    lines = [line for line in output.splitlines() if line.strip()]
    gaps: list[str] = []
    cursor, marked, previous = -1, True, None
    for line in shown.splitlines():
        if not line.strip():
            continue
        if line.strip() == "…":
            marked = True
            continue
        pattern = re.compile(line_pattern(line))
        at = next((i for i in range(cursor + 1, len(lines)) if pattern.search(lines[i])), None)
        if at is None:
            gaps.append(f"{line!r} is not printed after {previous!r}")
            break
        if previous is not None and not marked and at != cursor + 1:
            gaps.append(f"{at - cursor - 1} line(s) between {previous!r} and {line!r}")
        cursor, marked, previous = at, False, line
    return gaps


def test_an_omitted_run_of_lines_must_be_marked():
    output = "a 1\nb 2\nc 3\nd 4\n"
    assert unmarked_gaps("a 1\nb 2\n", output) == []
    assert unmarked_gaps("a 1\n…\nd 4\n", output) == []
    assert unmarked_gaps("a 1\nc 3\n", output) == ["1 line(s) between 'a 1' and 'c 3'"]
    assert unmarked_gaps("c 3\na 1\n", output)   # out of order


def _normalised(command: str) -> str:
    command = re.sub(r"^python -m (pip|pytest)\b", r"\1", command.strip())
    return " ".join(word for word in command.split() if word != "-q")


def _ci_commands() -> set[str]:
    ci = (ROOT / ".ci" / "run").read_text()
    return {_normalised(re.sub(r"^[A-Z0-9_]+=\S+ ", "", line.strip())) for line in ci.splitlines()}


def test_readme_is_short_and_its_links_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md must stay within 200 lines: move detail into docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_pattern_reads_numbers_spaces_and_ellipses():
    pattern = line_pattern("readiness …: 90/100 - 0 op(s)  │ x …")
    assert re.search(pattern, "readiness for torch_npu 2.14.0: 85/100 - 3 op(s)   │ x  y")
    assert not re.search(pattern, "readiness: 90/100 - 0 ops │ x")


@pytest.mark.parametrize("page", RUN_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_commands_run_and_print_what_is_shown(page, tmp_path):
    examples = shell_examples(page.read_text())
    assert examples or page.name != "README.md", "README.md shows no ```sh command"
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    ci = _ci_commands()
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    for command, shown in examples:
        if not command.startswith("opscope "):
            assert _normalised(command) in ci, f"{page.name}: `{command}` is neither run here nor by .ci/run"
            continue
        proc = subprocess.run([sys.executable, "-m", "opscope", *shlex.split(command)[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{page.name}: `{command}` exited {proc.returncode}: {proc.stderr[-2000:]}"
        output = proc.stdout + proc.stderr
        for line in (shown or "").splitlines():
            if line.strip() and line.strip() != "…":
                assert re.search(line_pattern(line), output), \
                    f"{page.name}: `{command}` no longer prints a line like {line!r}"
        gaps = unmarked_gaps(shown or "", output)
        assert not gaps, f"{page.name}: `{command}`: lines left out without a '…' line: {gaps[0]}"


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_commands_reference_is_generated_from_the_parser():
    from opscope.cli import build_parser
    from opscope.commands._common import leaf_parsers
    text = _hook().cli_reference()
    assert "<!-- opscope:cli -->" in (ROOT / "docs" / "reference" / "cli.md").read_text()
    for parser in leaf_parsers(build_parser()):
        assert f"`{parser.prog}`" in text.replace("`opscope ", "`opscope ")
        for action in parser._actions:
            shown = action.dest != "help" and action.help != argparse.SUPPRESS
            for option in action.option_strings if shown else ():
                assert f"`{option}`" in text, f"{parser.prog} {option} is missing from the reference"


def test_glossary_defines_every_verdict_and_root_cause_kind():
    from opscope.model import ROOT_KINDS, VERDICTS
    from opscope.report.glossary import terms
    every = terms()
    named = {t["term"] for t in every}
    assert set(VERDICTS) <= named and set(ROOT_KINDS) <= named, set(VERDICTS) | set(ROOT_KINDS) - named
    for entry in every:
        assert entry["kind"] in ("verdict", "root-cause", "concept") and entry["says"], entry
        if entry.get("page"):
            assert (ROOT / "docs" / entry["page"]).exists(), entry
    text = _hook().glossary()
    for entry in every:
        assert f"{{ #{entry['anchor']} }}" in text


def test_report_links_verdicts_to_its_glossary(huber_scan):
    from opscope.report.html import render_html
    from opscope.schema import load_scan
    html = render_html(load_scan(huber_scan / "scan.json"), charts={})
    assert 'id="glossary"' in html
    for verdict in ("native", "cpu-fallback", "adapter", "unknown"):
        assert f'id="g-{verdict}"' in html
    assert '"#g-" + verdict' in html and '"#g-" + value' in html   # evidence cells and verdict badges link there


def _docs_commands() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [(str(page.relative_to(ROOT)), command) for page in pages
            for command, _ in shell_examples(page.read_text()) if command.startswith("opscope ")]


@pytest.mark.parametrize("page,command", _docs_commands())
def test_every_documented_command_parses(page, command):
    """Every `opscope` command a page shows in a ```sh block is accepted by the CLI as written."""
    from opscope.cli import build_parser
    argv = shlex.split(command)[1:]
    argv = argv[:argv.index("--")] if "--" in argv else argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:   # argparse's way of saying no: one line on stderr
        pytest.fail(f"{page}: `{command}` is refused by the CLI (exit {exc.code})")
    assert callable(args.func)


def test_the_report_screenshot_shows_the_reports_sections(cnn_scan, tmp_path):
    """docs/images/report-screenshot.png is taken by docs/hooks/screenshots.py, which records the report's
    sections beside it: a report that gains, loses or reorders a section makes the picture stale."""
    spec = importlib.util.spec_from_file_location("screenshots", ROOT / "docs" / "hooks" / "screenshots.py")
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    proc = subprocess.run([sys.executable, "-m", "opscope", "report", str(cnn_scan), "--format", "html", "-o",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    now = shots.report_sections((tmp_path / "report.html").read_text(encoding="utf-8"))
    recorded = __import__("json").loads(shots.RECORD.read_text(encoding="utf-8"))["sections"]
    assert "Port plan" in now and now == recorded, (
        f"the report's sections changed ({recorded} -> {now}): the screenshot is stale; take it again with "
        "`python docs/hooks/screenshots.py`")
    page = (ROOT / "docs" / "getting-started" / "reading-the-report.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| \*\*(.+?)\*\* \|", page, re.M)
    wanted = [s for s in now if not s.startswith("What will be slow")]   # named by chip in the report
    assert [s for s in listed if s in wanted] == wanted, \
        f"reading-the-report.md lists the sections {listed}; the report has {now}"


def test_the_python_api_reference_is_generated_from_docstrings():
    """docs/reference/python-api.md is filled from the code: every public function, class and member has a
    docstring, and a new public member appears without anyone editing the page."""
    hook = _hook()
    assert "<!-- opscope:api -->" in (ROOT / "docs" / "reference" / "python-api.md").read_text()
    text = hook.api_reference()
    import inspect

    import opscope
    assert callable(opscope.capture) and callable(opscope.load) and callable(opscope.load_diff)
    for shown, target in hook.API:
        obj = hook._resolve(target)
        assert f"`{shown}`" in text and hook._doc(obj), f"{shown} has no docstring"
        for name, member in hook._members(obj) if inspect.isclass(obj) else ():
            assert hook._doc(member), f"{shown}.{name} has no docstring: the API reference would show it bare"
            assert f"| `{name}` |" in text


def test_pages_speak_the_users_language_not_the_teams():
    """Issue numbers and the team's names for its data are internal history: they belong in the changelog (and
    the commit log), not on the pages a user reads."""
    internal = re.compile(r"\bissues? #?\d+|(?<![\w&])#\d{2,3}\b|\bthe shared (?:AlexNet|LLM) run\b", re.I)
    found = [f"{page.relative_to(ROOT)}:{n}: {m.group(0)}"
             for page in sorted((ROOT / "docs").rglob("*.md")) if page.name != "changelog.md"
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if (m := internal.search(line))]
    assert not found, found
