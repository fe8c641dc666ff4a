"""The release plan (`opscope matrix plan`): releases that run a scan's operators, the first release of each
blocking operator (as `opscope matrix show` says), release_pairs.yaml, the environment and requirement files."""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import run_opscope

from opscope.analysis.plan.environment import environment_against, project_requirements
from opscope.analysis.plan.releases import build_plan, judge_releases, release_facts
from opscope.commands.matrix import show_rows
from opscope.knowledge import load
from opscope.matrix.store import load_matrix
from opscope.model import Operator

DATA = Path(__file__).parent / "data" / "release_plan"
GOOD = ("native", "composite", "adapter", "not-applicable")
# aten::logit has no NPU kernel before torch_npu 2.1.0.post13 (`opscope matrix show aten::logit --target
# 2.1.0.post12`: cpu-fallback, "first supported in torch_npu 2.1.0.post13"); aten::add.Tensor runs everywhere
BLOCKER = ("aten::logit", None)


def _ops():
    return [Operator(name="aten::add", overload="Tensor"), Operator(name=BLOCKER[0], overload=BLOCKER[1])]


@pytest.fixture(scope="module")
def plan():
    return build_plan(_ops())


def test_oldest_release_is_blocked_by_a_named_operator(plan):
    matrix = load_matrix()
    assert plan.fewest_blocking == 0 and plan.all_native
    assert plan.oldest.torch_npu == "2.1.0.post13"        # not 2.1.0.post8, the matrix's oldest
    assert matrix.versions[0] == "2.1.0.post8"
    assert plan.newest.torch_npu == matrix.versions[-1]
    blocker = next(b for b in plan.blockers if b.op == "aten::logit")
    assert blocker.first_supported_in == "2.1.0.post13"
    assert blocker.blocked_in[0] == ["2.1.0.post8", "2.1.0.post12"]
    assert blocker.verdicts == ["cpu-fallback"]
    assert [b.op for b in plan.blockers] == ["aten::logit"]
    per = {r.version: r.blocking_signatures for r in plan.per_release}
    assert per["2.1.0.post8"] == per["2.1.0.post12"] == 1 and per["2.1.0.post13"] == 0
    # each planned release comes with torch / python / CANN
    assert plan.oldest.torch == "2.1.0" and plan.oldest.cann == "8.2.RC1"
    assert "3.10" in plan.oldest.python
    assert plan.planned.cann and not plan.planned.cann_inferred


def _good_in_show(op: str, version: str) -> bool:
    return all(row["verdict"] in GOOD for row in show_rows(op, version))


@pytest.mark.parametrize("op", ["aten::logit", "aten::scatter_reduce.two", "aten::gelu.out"])
def test_first_supported_release_agrees_with_matrix_show(op):
    name, _, overload = op.partition(".")
    plan = build_plan([Operator(name=name, overload=overload or None)])
    blocker = next(b for b in plan.blockers if b.op == op)
    matrix = load_matrix()
    good = [v for v in matrix.versions if _good_in_show(op, v)]
    assert blocker.first_supported_in == good[0]
    supported = [v for a, b in blocker.supported_in for v in matrix.versions
                 if matrix.versions.index(a) <= matrix.versions.index(v) <= matrix.versions.index(b)]
    assert supported == good
    # `matrix show` on the oldest release names the same first release in its evidence
    rows = show_rows(op, matrix.versions[0])
    assert {row["evidence"].get("first_supported_in") for row in rows} == {f"torch_npu {blocker.first_supported_in}"}


def test_judging_every_release_is_fast():
    ops = _ops() * 50
    started = time.perf_counter()
    rows = judge_releases(ops)
    assert len(rows) == len(load_matrix().versions)
    assert time.perf_counter() - started < 30


def test_release_pairs_cover_the_matrix_with_sources():
    data = load("release_pairs.yaml")
    matrix = load_matrix()
    assert set(data["releases"]) == set(matrix.versions)
    for version, entry in data["releases"].items():
        if entry["cann"] is None or entry.get("inferred"):
            assert entry.get("why"), version
        if entry["cann"]:
            assert entry["source"] in data["sources"], version
        assert entry["python"], version
        release = matrix.exact[version]
        assert release.torch.rsplit(".", 1)[0] == data["lines"][release.line]["torch"].rsplit(".", 1)[0]
    facts = release_facts("2.10.0.post2")
    assert facts["cann"] == "9.0.0" and "README.md" in facts["cann_source"]
    assert release_facts("2.7.1.post6")["cann_inferred"] is True


def _project(tmp_path, name) -> Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    (folder / ".git").mkdir()   # the project root: the search stops here
    return folder / "train.py"


PLANNED = {"torch_npu": "2.6.0", "torch": "2.6.0", "python": ["3.9", "3.10", "3.11"], "cann": "8.2.RC1",
           "cann_inferred": False}


def test_pinned_requirements_change_line_by_line(tmp_path):
    env = environment_against(PLANNED, script=str(_project(tmp_path, "pinned")))
    changes = {c["where"]: c for c in env["changes"] if c["where"] != "installed"}
    assert changes["requirements.txt:3"]["from"] == "torch==2.5.1"
    assert changes["requirements.txt:3"]["to"] == "torch==2.6.0"
    assert "torch_npu 2.6.0 is built for torch 2.6.0" in changes["requirements.txt:3"]["reason"]
    assert changes["requirements.txt:4"]["to"] == "torchvision==0.21.*"
    assert "requirements.txt:2" not in changes   # numpy: not the plan's
    assert "CANN 8.2.RC1" in env["install"] and "pip install torch-npu==2.6.0" in env["install"]


def test_range_requirements(tmp_path):
    plan_27 = {**PLANNED, "torch_npu": "2.7.1", "torch": "2.7.1"}
    env = environment_against(plan_27, script=str(_project(tmp_path, "ranges")))
    changes = {c["where"]: c for c in env["changes"] if c["where"] != "installed"}
    assert changes["requirements.txt:1"]["from"] == "torch>=2.1,<2.6"
    assert changes["requirements.txt:1"]["to"] == "torch==2.7.1"
    assert "requirements.txt:2" not in changes            # unpinned torchvision: any release
    assert changes["pyproject.toml:5"]["from"] == "torch_npu>=2.1,<2.3"
    assert changes["pyproject.toml:5"]["to"] == "torch_npu==2.7.1"
    assert "pyproject.toml:4" not in changes              # torch>=2.4 takes 2.7.1


def test_absent_requirement_files_are_a_note(tmp_path):
    requirements, files, notes = project_requirements(str(_project(tmp_path, "absent")))
    assert requirements == [] and files == []
    assert any("no requirements" in n for n in notes)


def test_malformed_requirement_files_are_skipped_with_notes(tmp_path):
    script = _project(tmp_path, "malformed")
    requirements, files, notes = project_requirements(str(script))
    assert [r["text"] for r in requirements] == ["torch==2.5.1"]
    assert any("requirements.txt:2: not a requirement" in n for n in notes)
    assert any("requirements.txt:4: not a requirement" in n for n in notes)
    assert any("pyproject.toml: not valid TOML" in n for n in notes)
    unreadable = script.parent / "requirements-dev.txt"
    unreadable.write_bytes(b"\xff\xfe torch==1.0")
    requirements, _, notes = project_requirements(str(script))
    assert any("requirements-dev.txt: cannot be read" in n for n in notes)
    env = environment_against(PLANNED, script=str(script))
    assert any(c["where"] == "requirements.txt:1" for c in env["changes"])


def test_matrix_plan_on_a_real_scan(cnn_scan):
    proc = run_opscope("matrix", "plan", cnn_scan)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "torch_npu range: 2.1.0.post8 .. " in out
    assert "planned" in out and "torch" in out and "CANN" in out
    assert "install on the Ascend machine:" in out
    assert "pip install torch-npu==" in out and "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in out
    proc = run_opscope("matrix", "plan", cnn_scan, "--json")
    assert proc.returncode == 0
    plan = json.loads(proc.stdout)
    assert plan["all_native"] and plan["install"].startswith("# 1. CANN")


def test_matrix_plan_bad_run_dir(tmp_path):
    proc = run_opscope("matrix", "plan", tmp_path / "missing")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr


def test_known_incompatibility_of_a_pinned_requirement(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / ".git").mkdir()
    (folder / "train.py").write_text("print(1)\n")
    (folder / "requirements.txt").write_text("transformers==5.24.0\naccelerate>=0.30\ntransformers>=4.46\n")
    planned = {**PLANNED, "torch_npu": "2.5.1", "torch": "2.5.1"}
    env = environment_against(planned, script=str(folder / "train.py"))
    flagged = {c["where"]: c for c in env["changes"] if c["where"].startswith("requirements")}
    assert "needs torch 2.6 or newer" in flagged["requirements.txt:1"]["reason"]
    assert "HW" in flagged["requirements.txt:1"]["reason"]
    assert "requirements.txt:3" not in flagged   # a range that takes older transformers releases


def test_every_report_leads_with_the_plan(cnn_scan, tmp_path):
    """The plan is in scan.json and opscope.load, and first after the verdict in terminal, HTML, Markdown, XLSX."""
    import openpyxl

    import opscope
    from conftest import run_opscope
    data = json.loads((cnn_scan / "scan.json").read_text())
    plan = data["plan"]
    assert plan["all_native"] and plan["planned"]["torch_npu"] and plan["install"]
    run = opscope.load(cnn_scan)
    assert run.plan["planned"] == plan["planned"] and list(run.plan_changes.columns)[:2] == ["where", "package"]
    proc = run_opscope("report", cnn_scan, "--format", "html,md,xlsx", "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    from opscope.report.terminal import make_console, print_summary
    from opscope.schema import load_scan
    console = make_console()
    with console.capture() as captured:
        print_summary(load_scan(cnn_scan / "scan.json"), console, run_dir=str(cnn_scan))
    lines = captured.get().splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("On torch_npu"))
    assert lines[verdict + 1].startswith(f"Port plan: install torch_npu {plan['planned']['torch_npu']} (torch ")
    html = (tmp_path / "report.html").read_text()
    assert html.index('id="plan"') < html.index('id="fixes"') and "Install on the Ascend machine" in html
    md = (tmp_path / "report.md").read_text()
    assert md.index("## Port plan") < md.index("## Verdicts") and "pip install torch-npu==" in md
    sheets = openpyxl.load_workbook(tmp_path / "report.xlsx").sheetnames
    assert sheets[:2] == ["Fixes", "Plan"]


def test_pip_compile_requirements_with_hashes_and_continuations_are_read(tmp_path):
    from opscope.analysis.plan.environment import parse_requirements_txt
    path = tmp_path / "requirements.txt"
    path.write_text("torch==2.5.1 \\\n    --hash=sha256:abc \\\n    --hash=sha256:def\n"
                    "torchvision==0.20.1\t# pinned with torch\n-r other.txt\nnumpy>=1.2 --hash=sha256:x\n")
    notes: list[str] = []
    rows = parse_requirements_txt(path, notes)
    assert [(r["line"], str(r["requirement"])) for r in rows] == [(1, "torch==2.5.1"), (4, "torchvision==0.20.1"),
                                                                   (6, "numpy>=1.2")]
    assert notes == []


def test_a_bundled_example_is_not_judged_by_opscopes_own_project_file():
    """examples/ lies in opscope's checkout: its pyproject.toml is the tool's, not the script's project."""
    root = Path(__file__).resolve().parents[1]
    assert (root / "pyproject.toml").is_file()
    requirements, files, notes = project_requirements(str(root / "examples" / "train_cnn.py"))
    assert str(root / "pyproject.toml") not in files and requirements == []
    assert any("opscope's own project folder" in n for n in notes)
    env = environment_against(PLANNED, script=str(root / "examples" / "train_cnn.py"))
    assert not any("pyproject.toml" in c["where"] for c in env["changes"])


def test_the_plan_says_why_it_installs_an_older_release_than_the_newest_that_runs_the_job():
    """Judged for the newest release, the plan may install an older one: every format says why, where it prints it."""
    plan = build_plan([])
    from opscope.report import plan_view
    newest, planned = plan.newest.torch_npu, plan.planned.torch_npu
    line = plan_view.choice_line(plan)
    if newest == planned:   # a matrix whose newest release has a stated CANN pairing: nothing to explain
        assert line is None
        return
    assert line.startswith(f"Why {planned}: {newest} runs as many operators natively")
    assert "CANN pairing" in line and len(line) < 140   # one terminal line, not wrapped
    assert plan_view.choice_line(dataclasses.replace(plan, planned=plan.newest)) is None


def test_the_plan_is_a_typed_section_that_round_trips_through_scan_json(tmp_path):
    """``ScanResult.plan`` is a ``PortPlan`` read through the checked builder: written and read back it is the same,
    key for key (scan.json's ``from`` of a change is the field ``from_``), and a bad value is a schema error naming
    its JSON path."""
    from opscope.analysis.plan.releases import plan_for
    from opscope.model import PlanBlocker, PlanChange, PortPlan, ReleaseFacts, ScanResult
    from opscope.typed import SchemaError
    plan = plan_for(ScanResult(script=str(_project(tmp_path, "pinned")), operators=_ops()), target="2.1.0.post8")
    assert isinstance(plan, PortPlan) and isinstance(plan.planned, ReleaseFacts)
    assert isinstance(plan.blockers[0], PlanBlocker) and plan.planned.blocking_ops == {"aten::logit": "cpu-fallback"}
    doc = ScanResult(plan=plan).to_dict()["plan"]
    assert list(doc)[:3] == ["releases_judged", "fewest_blocking", "all_native"]
    assert list(doc)[-3:] == ["timing_s", "environment", "install"] and doc["install"] == plan.environment.install
    change = next(c for c in plan.environment.changes if c.where == "requirements.txt:3")
    assert isinstance(change, PlanChange) and change.from_ == "torch==2.5.1" and change.to == "torch==2.1.0"
    assert list(doc["environment"]["changes"][0]) == ["where", "package", "from", "to", "reason"]
    back = ScanResult(plan=json.loads(json.dumps(doc))).plan
    assert isinstance(back, PortPlan) and json.dumps(back.to_dict()) == json.dumps(doc)
    bad_cases = [({**doc, "all_native": "yes"}, "$.plan.all_native"),
                 ({**doc, "blockers": [{**doc["blockers"][0], "first_supported_in": 2}]},
                  "$.plan.blockers[0].first_supported_in"),
                 ({**doc, "environment": {**doc["environment"], "changes": [{"where": "installed", "from": 5}]}},
                  "$.plan.environment.changes[0].from"),
                 ({k: v for k, v in doc.items() if k != "planned"}, "$.plan")]
    for bad, where in bad_cases:
        with pytest.raises(SchemaError) as error:
            ScanResult(plan=bad)
        assert error.value.where == where
