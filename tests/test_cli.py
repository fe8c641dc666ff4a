"""One CLI grammar: -o/--out, -q/--quiet, -v everywhere; --format from one reporter registry;
--device checked by argparse; defaults from [tool.opscope] / .opscope.toml."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from opscope.cli import build_parser, main


def usage_error(argv) -> int:
    """argparse's exit code for a command line (usage errors exit 2 before any work)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code
from opscope.commands._common import leaf_parsers
from opscope.report import registry
from opscope.report.render import write_reports
from test_report_fixtures import realistic_scan


def _options(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_command_takes_out_and_quiet():
    parsers = {p.prog: p for p in leaf_parsers(build_parser())}
    assert {"opscope scan", "opscope report", "opscope diff", "opscope verify", "opscope migrate",
            "opscope matrix build", "opscope matrix show"} <= set(parsers)
    for prog, parser in parsers.items():
        if prog == "opscope matrix":
            continue  # only chooses build or show
        assert {"-o", "--out", "-q", "--quiet", "-v", "--verbose"} <= _options(parser), prog


def test_old_output_spelling_is_a_hidden_alias(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json",))
    assert main(["report", str(run_dir), "--format", "md", "--output-dir", str(tmp_path / "old")]) == 0
    assert main(["report", str(run_dir), "--format", "md", "-o", str(tmp_path / "new"), "-q"]) == 0
    assert (tmp_path / "old" / "report.md").is_file() and (tmp_path / "new" / "report.md").is_file()
    assert capsys.readouterr().out.split() == [str(tmp_path / "old" / "report.md")]  # -q: nothing printed
    assert "--output-dir" not in build_parser()._subparsers._group_actions[0].choices["report"].format_help()


@pytest.mark.parametrize("command", [["report", "RUN"], ["diff", "A", "B"], ["scan", "x.py"]])
def test_format_rejects_unknown_ones_with_the_valid_list(command, capsys):
    assert usage_error(command + ["--format", "html,pdf"]) == 2
    err = capsys.readouterr().err.strip()
    kind = "diff" if command[0] == "diff" else "scan"
    assert err.startswith("opscope: error: unknown --format pdf: choose from ")
    assert ", ".join(sorted(registry.reporters(kind))) in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", [["scan", "x.py"], ["verify", "RUN"]])
def test_device_is_checked_by_argparse(command, capsys):
    assert usage_error(command + ["--device", "tpu"]) == 2
    assert "unknown --device 'tpu': choose from auto, cpu, cuda, npu" in capsys.readouterr().err


class DummyReporter:
    """What a new format needs: a name, a file name, the kind of result and write()."""
    name, file_name, kind = "dummy", "report.dummy", "scan"

    def write(self, result, path):
        Path(path).write_text(f"{len(result.operators)} operators\n")
        return Path(path)


def test_a_new_reporter_is_one_registration(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json",))
    assert usage_error(["report", str(run_dir), "--format", "dummy"]) == 2  # not known yet
    registry.register(DummyReporter())
    try:
        assert "dummy" in registry.reporters("scan") and "dummy" not in registry.reporters("diff")
        assert main(["report", str(run_dir), "--format", "html,dummy"]) == 0
        assert (run_dir / "report.dummy").read_text() == f"{len(realistic_scan().operators)} operators\n"
        assert "dummy" in build_parser()._subparsers._group_actions[0].choices["scan"].format_help()
    finally:
        registry.unregister("scan", "dummy")
    capsys.readouterr()


def test_a_registered_format_next_to_scan_json_is_refreshed_by_rerender(tmp_path):
    """``opscope verify`` re-renders the reports it finds: a new format is one of them, scan.json is not."""
    from opscope.report.render import existing_reports, rerender
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json", "md"))
    registry.register(DummyReporter())
    try:
        (run_dir / "report.dummy").write_text("stale\n")
        assert set(existing_reports(run_dir)) == {"md", "dummy"}
        changed = realistic_scan()
        changed.operators = changed.operators[:1]
        written = rerender(changed, run_dir)
        assert sorted(p.name for p in written) == ["report.dummy", "report.md"]
        assert (run_dir / "report.dummy").read_text() == "1 operators\n"
    finally:
        registry.unregister("scan", "dummy")


def test_every_bundled_format_is_a_module_of_the_formats_package():
    import pkgutil

    from opscope.report import formats
    modules = {m.name for m in pkgutil.iter_modules(formats.__path__)}
    assert modules == {"html", "xlsx", "json", "markdown", "sarif"}
    assert set(registry.reporters("scan")) == {"html", "xlsx", "json", "md", "sarif"}
    assert set(registry.reporters("diff")) == {"html", "xlsx", "json"}


def test_project_config_sets_defaults_and_the_command_line_wins(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.opscope]\ntarget = "2.8.0"\nsteps = 7\nformats = ["html", "md"]\n'
        'fail-under = 70\n\n[tool.opscope.report]\nformats = ["md"]\n')
    sub = tmp_path / "src"
    sub.mkdir()
    monkeypatch.chdir(sub)  # found from a sub-folder, like ruff and coverage.py
    from opscope import config
    parser = build_parser()
    config.apply(parser, config.find_config())
    scan = parser.parse_args(["scan", "train.py"])
    assert (scan.target, scan.steps, scan.format, scan.fail_under) == ("2.8.0", 7, ("html", "md"), 70.0)
    scan = parser.parse_args(["scan", "train.py", "--steps", "3", "--format", "xlsx"])
    assert (scan.steps, scan.format) == (3, ("xlsx",))
    assert parser.parse_args(["report", "RUN"]).format == ("md",)  # the command's own table wins

    (sub / ".opscope.toml").write_text('format = "html,pdf"\n')  # nearer, and checked like the option
    assert usage_error(["report", "RUN"]) == 2
    assert "unknown --format pdf" in capsys.readouterr().err


def test_report_command_prints_nothing_with_quiet(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json",))
    assert main(["report", str(run_dir), "-q", "--format", "json"]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((run_dir / "scan.json").read_text())["operators"]


def test_verbose_logs_what_was_written(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    run_dir = tmp_path / "run"
    write_reports(realistic_scan(), run_dir, ("json",))
    cmd = [sys.executable, "-m", "opscope", "report", str(run_dir), "--format", "md", "-q"]
    quiet = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    verbose = subprocess.run(cmd + ["-v"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert quiet.returncode == verbose.returncode == 0
    assert quiet.stderr == "" and "wrote" in verbose.stderr and "md reporter" in verbose.stderr
