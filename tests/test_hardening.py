"""Hostile and broken input (issue 13's reproductions): every one exits 0 or 2 with one line,
memory follows the file size, user text never becomes a formula, markup or a crash."""
from __future__ import annotations

import csv
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import run_opscope
from opscope.cli import main
from opscope.parsers import load_profile

SHARED_RANK = (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ascend_profiles"
               / "alexnet_ddp_2rank" / "text" / "level1" / "rank0_ascend_pt")
needs_shared = pytest.mark.skipif(not SHARED_RANK.is_dir(), reason="../shared/data/ascend_profiles absent")


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("opscope: error:"), err
    return code, err


def _event(**over) -> dict:
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
             "args": {"Input Dims": [[2, 2], [2, 2]], "Input type": ["float", "float"]}}
    event.update(over)
    return event


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("good") / "good.json"
    path.write_text(json.dumps({"traceEvents": [_event(), _event(ts=20, name="aten::mul")]}))
    return path


@pytest.fixture
def scan_data(cnn_scan) -> dict:
    return json.loads((cnn_scan / "scan.json").read_text())


def _run_dir(tmp_path: Path, data: dict, name: str = "run") -> Path:
    run = tmp_path / name
    run.mkdir()
    data = dict(data, traces=[])
    (run / "scan.json").write_text(json.dumps(data))
    return run


# ----------------------------------------------------------------------------- Chrome traces
TRACE_CASES = {
    "deep-nesting": '{"traceEvents":[' + "[" * 100_000,
    "input-dims-900-deep": json.dumps({"traceEvents": [_event(args={"Input Dims": json.loads("[" * 900 + "]" * 900)})]}),
    "args-list": json.dumps({"traceEvents": [_event(args=[1])]}),
    "ts-1e400": '{"traceEvents":[' + json.dumps(_event()).replace('"ts": 10', '"ts": 1e400') + "]}",
    "dur-huge-int": '{"traceEvents":[' + json.dumps(_event()).replace('"dur": 5', '"dur": ' + "9" * 400) + "]}",
    "name-int": json.dumps({"traceEvents": [_event(name=5)]}),
    "pid-list": json.dumps({"traceEvents": [_event(pid=[1])]}),
    "not-an-event": json.dumps({"traceEvents": [1, 2, 3]}),
    "shapes-dict": json.dumps({"traceEvents": [_event(args={"Input Dims": [{"1": 2}]})]}),
}


@pytest.mark.parametrize("case", sorted(TRACE_CASES))
def test_hostile_chrome_traces_are_one_line_errors(case, good_trace, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(TRACE_CASES[case])
    code, err = _cli(capsys, "diff", good_trace, bad, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and str(bad) in err
    assert "event 0" in err or case == "deep-nesting"


def test_corrupt_gzip_is_a_one_line_error(good_trace, tmp_path, capsys):
    data = bytearray(gzip.compress(good_trace.read_bytes()))
    data[20] ^= 0xFF
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(data))
    code, err = _cli(capsys, "diff", good_trace, bad, "--out", tmp_path / "out", "--quiet")
    assert code == 2 and "cannot read" in err


# ----------------------------------------------------------------------------- text tables
def _table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = (30, 12, 14, 24)
    rule = "  ".join("-" * w for w in widths)
    line = lambda cells: "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([rule, line(("Name", "Self CPU", "# of Calls", "Input Shapes")), rule,
                      *map(line, rows), rule, "Self CPU time total: 2.000ms", ""])


def test_absurd_call_count_costs_one_record_not_one_per_call(tmp_path):
    """A 1 KB table claiming 100,000,000 calls: one counted record, not 10^8 objects."""
    path = tmp_path / "t.txt"
    path.write_text(_table([("aten::add", "1.000ms", "100000000", "[[2, 2], [2, 2]]")]))
    assert path.stat().st_size < 1024
    prof = load_profile(path)
    assert len(prof.calls) == 1 and prof.calls[0].count == 100_000_000
    assert prof.steps[0].op_calls == 100_000_000


@pytest.mark.parametrize("cell, shapes", [("{1: 2}", None), ("[[2, 2], [2, ...", []), ("1" * 400, None)])
def test_bad_input_shapes_cells(tmp_path, capsys, cell, shapes):
    path = tmp_path / "t.txt"
    path.write_text(_table([("aten::add", "1.000ms", "3", cell)]))
    if shapes is None:   # not a list of shapes: the line is named
        code, err = _cli(capsys, "diff", path, path, "--out", tmp_path / "out", "--quiet")
        assert code == 2 and "line 4" in err and "Input Shapes" in err
    else:                # cut short by the table width: kept without shapes
        assert load_profile(path).calls[0].input_shapes == shapes


def test_absurd_numbers_in_a_table_are_one_line_errors(tmp_path, capsys):
    for calls, time in (("1" * 400, "1.000ms"), ("3", "9" * 400 + "ms"), ("3", "1.2.3ms")):
        path = tmp_path / "t.txt"
        path.write_text(_table([("aten::add", time, calls, "[]")]))
        code, err = _cli(capsys, "diff", path, path, "--out", tmp_path / "out", "--quiet")
        assert code == 2 and "table 1, line 4" in err


# ----------------------------------------------------------------------------- Ascend folders
@needs_shared
def test_bad_step_trace_row_is_skipped_with_a_note_and_huge_rank_ignored(tmp_path, capsys):
    rank = tmp_path / "rank0_ascend_pt"
    shutil.copytree(SHARED_RANK, rank)
    csv_path = rank / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    rows = list(csv.reader(csv_path.open()))
    bad = list(rows[1])
    bad[1] = "8873.7x"
    huge = list(rows[1])
    huge[2] = "9" * 400
    with csv_path.open("w", newline="") as fh:
        csv.writer(fh).writerows([rows[0], rows[1], bad, huge])
    info = rank / "profiler_info_0.json"
    info.write_text(info.read_text().replace('"rank_id": 0', '"rank_id": ' + "1" * 400))
    os.chmod(info, 0o644)
    code, err = _cli(capsys, "diff", rank, rank, "--out", tmp_path / "out", "--quiet")
    assert code == 0, err
    result = json.loads((tmp_path / "out" / "diff.json").read_text())
    assert any("step_trace_time.csv: row 3, row 4 skipped" in n for n in result["notes"])
    assert len(result["a"]["step"]["device_breakdown_us"]) == 1
    assert (tmp_path / "out" / "diff.xlsx").stat().st_size > 0


# ----------------------------------------------------------------------------- scan.json
WRONG_TYPES = {
    "duration_s": ("long", "$.duration_s"), "target": ("2.1", "$.target"), "verification": ([1], "$.verification"),
    "operators[0].calls": ("many", "$.operators[0].calls"), "operators[0].name": (None, "$.operators[0].name"),
    "operators[0].input_shapes": (1.5, "$.operators[0].input_shapes"),
    "operators[0].steps": ([1.5], "$.operators[0].steps[0]"), "steps[0].index": (5.5, "$.steps[0].index"),
}


def _set(data: dict, dotted: str, value) -> dict:
    data = json.loads(json.dumps(data))
    node, parts = data, dotted.replace("[0]", ".0").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    node[parts[-1]] = value
    return data


@pytest.mark.parametrize("field", sorted(WRONG_TYPES))
def test_scan_json_with_wrong_types_is_exit_2_naming_the_json_path(field, scan_data, tmp_path, capsys):
    value, where = WRONG_TYPES[field]
    run = _run_dir(tmp_path, _set(scan_data, field, value))
    for argv in (("report", run), ("verify", run, "--device", "cpu", "--quiet"),
                 ("diff", run, run, "--out", tmp_path / "out", "--quiet")):
        code, err = _cli(capsys, *argv)
        assert code == 2 and where in err, (argv, err)


def test_newer_schema_major_is_refused_saying_which_opscope_reads_it(scan_data, tmp_path, capsys):
    run = _run_dir(tmp_path, dict(scan_data, schema="opscope.scan/999"))
    code, err = _cli(capsys, "report", run)
    assert code == 2 and "newer opscope" in err and "opscope.scan/1" in err


def test_hostile_json_documents(scan_data, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for text, words in (('{"schema": "opscope.scan/1", "notes": ' + "[" * 100_000, "nested too deeply"),
                        (json.dumps(dict(scan_data, extra=json.loads("[" * 40 + "]" * 40))), "deeper than"),
                        (json.dumps(scan_data).replace('"duration_s": ', '"duration_s": 1e400, "x": '), "out of range"),
                        (json.dumps(dict(scan_data, rank=10 ** 400)), "out of range")):
        (run / "scan.json").write_text(text)
        code, err = _cli(capsys, "report", run, "--format", "json")
        assert code == 2 and words in err


def test_rewriting_scan_json_keeps_fields_this_version_does_not_know(scan_data, tmp_path, capsys):
    data = dict(scan_data, future_block={"from": "opscope 2", "values": [1, 2]})
    data["operators"][0]["future_field"] = "kept"
    data["steps"][0]["future_step_field"] = 7
    run = _run_dir(tmp_path, data)
    code, _ = _cli(capsys, "report", run, "--format", "json")
    assert code == 0
    again = json.loads((run / "scan.json").read_text())
    assert again["future_block"] == {"from": "opscope 2", "values": [1, 2]}
    assert again["operators"][0]["future_field"] == "kept" and again["steps"][0]["future_step_field"] == 7
    code, _ = _cli(capsys, "verify", run, "--device", "cpu", "--only", "aten::relu", "--quiet")
    assert code == 0
    again = json.loads((run / "scan.json").read_text())
    assert again["future_block"]["from"] == "opscope 2" and again["operators"][0]["future_field"] == "kept"
    assert again["verification"]["results"]


def test_sections_are_written_back_key_for_key(scan_data, tmp_path):
    """The typed sections write the JSON they were read from: nulls stay, absent keys stay absent, fields of a
    newer schema are kept, and the key order is the file's (a scan.json is rewritten by report and verify)."""
    from opscope.schema import load_scan
    data = json.loads(json.dumps(scan_data))
    data["settings"] = {"steps": 3, "warmup": 0, "step_marker": "auto", "timeout": None, "target": None,
                        "requested_device": "auto", "chip": "Ascend910B2", "calibration": None,
                        "distributed": {"launcher": "spawn", "world_size": 2, "ranks": [0], "rank_dirs": {"0": "."}},
                        "future_setting": [1], "rank": 0}
    data["exit"] = {"kind": "timeout", "code": None, "message": "stopped", "where": None}
    data["summary"] = dict(data["summary"], readiness_score=None, score_unavailable="nothing measured",
                           future_share={"x": 1})
    data["target"] = {}
    data["verification"] = {"results": [{"outcome": "pass", "later": 1, "op": "aten::add", "metrics": {"cosine": None}}],
                            "seed": None, "device": "cpu"}
    run = _run_dir(tmp_path, data)
    text = json.dumps(json.loads((run / "scan.json").read_text()))
    assert json.dumps(load_scan(run).to_dict()) == text


def test_a_billion_recorded_calls_load_as_counts(scan_data, tmp_path):
    data = json.loads(json.dumps(scan_data))
    data["operators"][0]["calls"] = 1_000_000_000
    prof = load_profile(_run_dir(tmp_path, data))
    mine = [c for c in prof.calls if c.name == data["operators"][0]["name"]]
    assert len(prof.calls) < 10 * len(data["operators"])
    assert sum(c.count for c in mine) >= 1_000_000_000


# ----------------------------------------------------------------------------- special files
def test_fifo_inputs_are_refused_not_read(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for argv in (("diff", fifo, fifo, "--out", tmp_path / "o"), ("report", fifo)):
        proc = run_opscope(*argv, timeout=120)    # a regression would block on open(): the timeout ends it
        assert proc.returncode == 2 and "special file" in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1


# ----------------------------------------------------------------------------- writers
def test_control_characters_and_huge_numbers_never_crash_the_xlsx_writer(scan_data, tmp_path, capsys):
    from openpyxl import load_workbook

    ansi = "\x1b[31mRuntimeError\x1b[0m: CUDA error\x00\x07 at step 3\n"
    data = dict(scan_data, complete=False, incomplete_reason=ansi, device="=HYPERLINK(\"http://e.x\",\"x\")")
    data["exit"] = dict(data["exit"], message=ansi)
    data["operators"][0]["name"] = "\x1b[1maten::\x0bodd"
    data["operators"][0]["calls"] = 2 ** 62
    run = _run_dir(tmp_path, data)
    code, err = _cli(capsys, "report", run, "--format", "html,xlsx,md")
    assert code == 0, err
    wb = load_workbook(run / "report.xlsx")
    cells = [c for ws in wb for row in ws.iter_rows() for c in row if c.value is not None]
    texts = [c.value for c in cells if isinstance(c.value, str)]
    assert any("RuntimeError: CUDA error" in t for t in texts) and not any("\x1b" in t for t in texts)
    assert all(c.data_type != "f" for c in cells)
    device = next(c for c in cells if isinstance(c.value, str) and c.value.startswith("=HYPERLINK"))
    assert device.data_type == "s" and device.quotePrefix


def test_diff_xlsx_summary_headers_are_never_formulas(good_trace, tmp_path, capsys):
    from openpyxl import load_workbook

    code, _ = _cli(capsys, "diff", good_trace, good_trace, "--label-a", "=1+1", "--label-b", "@SUM(A1)",
                   "--out", tmp_path, "--quiet")
    assert code == 0
    header = load_workbook(tmp_path / "diff.xlsx")["Summary"][1]
    labels = {c.value: c for c in header}
    assert labels["=1+1"].data_type == "s" and labels["=1+1"].quotePrefix
    assert labels["@SUM(A1)"].quotePrefix


def test_operators_csv_and_markdown_escape_injections(scan_data, tmp_path):
    import pandas as pd

    from opscope.report.csv_out import write_operators_csv
    from opscope.report.markdown import render_markdown
    from opscope.schema import load_scan

    data = json.loads(json.dumps(scan_data))
    data["operators"][0]["source"] = "=cmd|' /C calc'!A0"
    data["operators"][0]["name"] = "@evil::op"
    data["argv"] = ["![t](http://attacker.example/p.png)", "[click](http://e.x)"]
    data["incomplete_reason"] = "see ![t](http://attacker.example/x.png)"
    data["complete"] = False
    run = _run_dir(tmp_path, data)
    scan = load_scan(run)
    write_operators_csv(scan, tmp_path / "operators.csv")
    table = pd.read_csv(tmp_path / "operators.csv")
    assert "'=cmd|' /C calc'!A0" in set(table["source"]) and "'@evil::op" in set(table["name"])
    markdown = render_markdown(scan)
    assert "attacker.example" in markdown                                  # shown as text ...
    assert not re.search(r"(?<!\\)!(?<!\\)\[|(?<!\\)\]\(", markdown)     # ... never as a link or image


# ----------------------------------------------------------------------------- support_matrix yaml
def test_every_knowledge_file_has_a_schema_and_passes_it():
    from opscope.knowledge import SCHEMAS, load
    from opscope.resources import support_matrix_dir

    shipped = {p.name for p in support_matrix_dir().glob("*.yaml")}
    assert shipped == set(SCHEMAS), "add the new file's keys to opscope.knowledge.SCHEMAS"
    for name in shipped:
        assert set(load(name)) <= set(SCHEMAS[name])


@pytest.mark.parametrize("name", ["diff_rules.yaml", "substitutes.yaml", "verify_standards.yaml",
                                  "dynamic_shapes.yaml"])
def test_a_misspelt_knowledge_key_is_an_error_not_ignored(name, tmp_path):
    from opscope.errors import InputError
    from opscope.knowledge import SCHEMAS, load, load_path
    from opscope.resources import support_matrix_dir

    assert set(load(name)) <= set(SCHEMAS[name])     # the shipped file passes
    text = (support_matrix_dir() / name).read_text()
    key = next(iter(load(name)))
    broken = tmp_path / name
    broken.write_text(text.replace(f"\n{key}:", f"\n{key[:-1]}x:", 1) if f"\n{key}:" in text
                      else text.replace(f"{key}:", f"{key[:-1]}x:", 1))
    with pytest.raises(InputError) as info:
        load_path(broken, name)
    assert f"unknown key '{key[:-1]}x'" in str(info.value) and f"did you mean '{key}'" in str(info.value)
    broken.write_text(f"{key}: 5\n")
    with pytest.raises(InputError, match="expected a"):
        load_path(broken, name)
    broken.write_text("[1, 2\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_path(broken, name)


# ----------------------------------------------------------------------------- options and scripts
@pytest.mark.parametrize("argv, words", [
    (("scan", "x.py", "--timeout", "nan"), "--timeout"), (("scan", "x.py", "--timeout", "inf"), "--timeout"),
    (("scan", "x.py", "--timeout", "0"), "--timeout"), (("scan", "x.py", "--target", ""), "--target"),
    (("scan", "x.py", "--fail-under", "nan"), "--fail-under"), (("matrix", "show", ""), "op"),
    (("matrix", "show", "aten::add", "--target", " "), "--target"), (("verify", "r", "--rtol", "-1"), "--rtol"),
    (("diff", "a", "b", "--label-a", ""), "--label-a"),
])
def test_bad_option_values_are_usage_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_a_script_that_does_not_compile_fails_up_front_with_its_line(tmp_path):
    bad = tmp_path / "train.py"
    bad.write_text("import torch\n\ndef step(:\n    pass\n")
    proc = run_opscope("scan", bad, "--out", tmp_path / "out", "--quiet")
    assert proc.returncode == 2 and f"{bad}:3:" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out" / "scan.json").exists()
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    proc = run_opscope("scan", binary, "--out", tmp_path / "out", "--quiet")
    assert proc.returncode == 2 and "does not compile" in proc.stderr


def test_a_fifo_as_log_or_e2e_script_is_refused(good_trace, tmp_path):
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    proc = run_opscope("diff", good_trace, good_trace, "--log-b", fifo, "--out", tmp_path / "o", "--quiet",
                       timeout=120)
    assert proc.returncode == 2 and "special file" in proc.stderr
    script = tmp_path / "e2e.py"
    script.write_text("def f(:\n")
    proc = run_opscope("verify", "--e2e", script, "--device", "cpu", "--out", tmp_path / "e2e", timeout=120)
    assert proc.returncode == 2 and f"{script}:1:" in proc.stderr


def test_output_folder_that_is_a_file_is_exit_2_before_loading(scan_data, good_trace, tmp_path, capsys):
    run = _run_dir(tmp_path, scan_data)
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    for argv in (("report", run, "-o", taken), ("diff", good_trace, good_trace, "--out", taken, "--quiet"),
                 ("report", run, "-o", taken / "sub")):
        code, err = _cli(capsys, *argv)
        assert code == 2 and str(taken) in err
    assert taken.read_text() == "a file, not a folder"


# malformed sections (written by another tool, or edited): a malformed ``verification`` used to crash the
# reports; every section the model types (settings, exit, summary, target, verification, plan) is checked on load.
# Each case: the section's dotted path in scan.json, the value put there, the JSON path the error must name.
BAD_SECTIONS = {
    "settings-a-list": ("settings", [], "$.settings"),
    "settings-null": ("settings", None, "$.settings"),
    "settings-steps-a-string": ("settings.steps", "3", "$.settings.steps"),
    "settings-steps-a-float": ("settings.steps", 1.5, "$.settings.steps"),
    "settings-steps-huge": ("settings.steps", 10 ** 30, "$.settings.steps"),
    "settings-timeout-a-string": ("settings.timeout", "long", "$.settings.timeout"),
    "settings-distributed-a-list": ("settings.distributed", [0, 1], "$.settings.distributed"),
    "settings-requested-device-an-object": ("settings.requested_device", {"cpu": 1}, "$.settings.requested_device"),
    "exit-an-int": ("exit", 3, "$.exit"),
    "exit-code-a-string": ("exit.code", "1", "$.exit.code"),
    "exit-kind-a-list": ("exit.kind", ["exit"], "$.exit.kind"),
    "exit-message-huge": ("exit.message", 10 ** 400, "$.exit.message"),
    "summary-a-list": ("summary", [], "$.summary"),
    "summary-null": ("summary", None, "$.summary"),
    "summary-score-a-string": ("summary.readiness_score", "90", "$.summary.readiness_score"),
    "summary-score-huge": ("summary.readiness_score", 10 ** 400, "$.summary.readiness_score"),
    "summary-counts-a-list": ("summary.verdict_counts", [1], "$.summary.verdict_counts"),
    "summary-count-a-string": ("summary.verdict_counts", {"native": "3"}, "$.summary.verdict_counts.native"),
    "summary-share-a-string": ("summary.time_share", {"native": "all"}, "$.summary.time_share.native"),
    "summary-blocking-an-object": ("summary.blocking_ops", {}, "$.summary.blocking_ops"),
    "summary-precision-a-list": ("summary.precision", [], "$.summary.precision"),
    "target-a-string": ("target", "2.1", "$.target"),
    "target-null": ("target", None, "$.target"),
    "target-version-a-number": ("target.version", 2.1, "$.target.version"),
    "target-source-a-list": ("target.source", ["wheel"], "$.target.source"),
    "verification-a-list": ("verification", [], "$.verification"),
    "verification-a-string": ("verification", "passed", "$.verification"),
    "verification-results-a-string": ("verification", {"results": "x"}, "$.verification.results"),
    "verification-result-an-int": ("verification", {"results": [1]}, "$.verification.results[0]"),
    "verification-outcome-an-int": ("verification", {"results": [{"outcome": 5}]},
                                    "$.verification.results[0].outcome"),
    "verification-message-an-object": ("verification", {"results": [{"outcome": "skipped", "message": {}}]},
                                       "$.verification.results[0].message"),
    "verification-metrics-a-list": ("verification", {"results": [{"outcome": "pass", "metrics": [1]}]},
                                    "$.verification.results[0].metrics"),
    "verification-counts-a-list": ("verification", {"counts": []}, "$.verification.counts"),
    "verification-count-a-string": ("verification", {"counts": {"fail": "2"}}, "$.verification.counts.fail"),
    "verification-count-huge": ("verification", {"counts": {"fail": 10 ** 30}}, "$.verification.counts.fail"),
    "verification-e2e-a-string": ("verification", {"e2e": "ok"}, "$.verification.e2e"),
    "verification-duration-a-string": ("verification", {"duration_s": "3 s"}, "$.verification.duration_s"),
    "verification-seed-a-float": ("verification", {"seed": 1.5}, "$.verification.seed"),
    "verification-substitutes-an-object": ("verification", {"substitutes": {}}, "$.verification.substitutes"),
    "plan-a-list": ("plan", [], "$.plan"),
    "plan-all-native-a-string": ("plan.all_native", "yes", "$.plan.all_native"),
    "plan-planned-version-a-number": ("plan.planned", {"torch_npu": 2.1}, "$.plan.planned.torch_npu"),
    "plan-change-from-an-int": ("plan.environment", {"changes": [{"from": 5}]}, "$.plan.environment.changes[0].from"),
}


def _put(data: dict, dotted: str, value) -> dict:
    """``data`` with the section (``summary``) or one of its fields (``summary.readiness_score``) replaced."""
    data = json.loads(json.dumps(data))
    section, _, key = dotted.partition(".")
    if key:
        data[section][key] = value
    else:
        data[section] = value
    return data


@pytest.mark.parametrize("case", sorted(BAD_SECTIONS))
def test_malformed_section_is_exit_2_naming_the_json_path(case, scan_data, tmp_path, capsys):
    dotted, value, where = BAD_SECTIONS[case]
    run = _run_dir(tmp_path, _put(scan_data, dotted, value))
    code, err = _cli(capsys, "report", run, "--format", "html,md")   # one line, no traceback: see _cli
    assert code == 2 and where in err, err


def test_a_well_formed_verification_block_still_renders(scan_data, tmp_path, capsys):
    good = {"device": "cpu", "seed": 0, "duration_s": 1.5, "counts": {"pass": 1, "skipped": 1},
            "results": [{"op": "aten::add", "outcome": "pass", "metrics": {"cosine": 1.0}, "input_shapes": [[2]],
                         "dtypes": ["float"]},
                        {"op": "aten::mul", "outcome": "skipped", "message": "argument x was not recorded"}],
            "future_field": {"kept": True}}
    run = _run_dir(tmp_path, dict(scan_data, verification=good))
    code, _ = _cli(capsys, "report", run, "--format", "html,md,json")
    assert code == 0
    assert json.loads((run / "scan.json").read_text())["verification"]["future_field"] == {"kept": True}
