"""Chip- and dtype-aware findings (issue 34, requirement 1): bf16 on a 910A vs a 910B, fp32
cube work on a 910A, HF32 defaults on a 910B, float64 / uint64 operators, int64 index writes,
and an unknown chip; the facts come from npu_chips.yaml with their sources."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS, load_scan, run_opscope

from opscope.analysis.verdicts.chip_dtypes import chip_dtype_findings
from opscope.errors import UserError
from opscope.model import Operator

MLP = SCRIPTS / "chip_dtypes" / "bf16_mlp.py"


def _op(name, dtypes, shapes=None, source="train.py:10", phase="forward", calls=3, **kw) -> Operator:
    shapes = shapes if shapes is not None else [[32, 64] for _ in dtypes]
    return Operator(name=name, dtypes=dtypes, input_shapes=shapes, source=source, phase=phase, calls=calls, **kw)


def _rules(findings) -> dict:
    return {f.rule: f for f in findings}


BF16_MM = _op("aten::mm", ["c10::BFloat16", "c10::BFloat16"], [[32, 64], [64, 128]])
FP32_MM = _op("aten::mm", ["float", "float"], [[32, 64], [64, 128]], source="train.py:20")
FP32_CONV = _op("aten::convolution", ["float", "float", "float"], [[8, 3, 32, 32], [16, 3, 3, 3], [16]],
                source="train.py:30")


def test_bf16_is_an_error_on_910a_with_the_fp16_gradscaler_fix_and_fine_on_910b():
    found = _rules(chip_dtype_findings([BF16_MM], "910A"))
    bf16 = found["chip-dtype-bf16"]
    assert bf16.severity == "error" and (bf16.file, bf16.line) == ("train.py", 10)
    assert "Ascend910A" in bf16.message and "mm" in bf16.message and "bfloat16" in bf16.message
    assert "bf16_910a_reports" in bf16.message            # the fact names its source
    assert "float16" in bf16.replacement and "GradScaler('npu')" in bf16.replacement
    assert chip_dtype_findings([BF16_MM], "910B2") == []
    assert chip_dtype_findings([BF16_MM], "Ascend910B4") == []


def test_fp32_cube_work_runs_as_fp16_on_910a_and_keeps_fp32_matmul_on_910b():
    on_a = _rules(chip_dtype_findings([FP32_MM, FP32_CONV], "910A"))
    cube = on_a["chip-dtype-fp32-cube"]
    assert cube.severity == "warning" and "allow_fp32_to_fp16" in cube.message
    assert {f.line for f in chip_dtype_findings([FP32_MM, FP32_CONV], "910A")} == {20, 30}
    on_b = chip_dtype_findings([FP32_MM, FP32_CONV], "910B2")
    # matmul: torch.npu.matmul.allow_hf32 defaults False -> strict fp32, nothing to say;
    # conv: torch.npu.conv.allow_hf32 defaults True -> HF32, said as info with the switch
    assert [(f.rule, f.line, f.severity) for f in on_b] == [("chip-dtype-hf32", 30, "info")]
    assert "torch.npu.conv.allow_hf32 = False" in on_b[0].replacement


def test_float64_uint64_and_complex_operators_are_flagged_on_every_chip():
    ops = [_op("aten::cumsum", ["double", "Scalar", ""], [[8], [], []], source="train.py:40"),
           _op("aten::cumsum", ["long unsigned int", "Scalar", ""], [[8], [], []], source="train.py:41"),
           _op("aten::mul", ["c10::complex<double>", "c10::complex<double>"], [[4], [4]], source="train.py:42")]
    for chip in ("910A", "910B3"):
        found = _rules(chip_dtype_findings(ops, chip))
        assert {"chip-dtype-float64", "chip-dtype-uint", "chip-dtype-complex"} <= set(found)
        assert "cumsum" in found["chip-dtype-float64"].message and "float32" in found["chip-dtype-float64"].replacement
        uint = found["chip-dtype-uint"]
        assert "uint64" in uint.message and "AI CPU" in uint.message and "long unsigned int" not in uint.message
        assert "complex128" in found["chip-dtype-complex"].message


def test_zero_dim_wrapped_numbers_views_and_host_only_setup_are_not_flagged():
    ops = [_op("aten::mul", ["float", "double"], [[4, 4], []]),          # x * 0.5: a 0-dim double
           _op("aten::select", ["double", "Scalar", "Scalar"], [[8], [], []]),   # a view: no kernel
           _op("aten::cumsum", ["double", "Scalar", ""], [[8], [], []], phase="other", on_device=False),
           _op("aten::cumsum", ["double", "Scalar", ""], [[8], [], []], import_time=True)]
    assert chip_dtype_findings(ops, "910A") == []


def test_int64_index_writes_reuse_the_cost_model_aicpu_rules():
    put = _op("aten::index_put_", ["float", "", "float", "Scalar"], [[4, 4], [], [], []], source="train.py:50")
    found = _rules(chip_dtype_findings([put], "910B2"))
    index = found["chip-dtype-int64-index"]
    assert index.severity == "warning" and "AI CPU" in index.message and "int32" in index.replacement


def test_one_finding_per_rule_and_line_with_the_calls_of_the_outer_operators():
    linear = _op("aten::linear", ["c10::BFloat16"] * 3, [[32, 64], [128, 64], [128]], calls=3,
                 children=["aten::t", "aten::addmm"])
    addmm = _op("aten::addmm", ["c10::BFloat16"] * 3, [[128], [32, 64], [64, 128]], calls=3, parent="aten::linear")
    found = chip_dtype_findings([linear, addmm], "910A")
    assert len(found) == 1 and found[0].count == 3
    assert "linear" in found[0].message and "addmm" in found[0].message


def test_unknown_chip_is_a_user_error_listing_the_known_chips():
    with pytest.raises(UserError) as err:
        chip_dtype_findings([BF16_MM], "910Z")
    assert "Ascend910A" in str(err.value) and "Ascend910B2" in str(err.value)


def test_every_family_of_a_chip_has_dtype_facts_with_declared_sources():
    from opscope import knowledge
    data = knowledge.load("npu_chips.yaml")
    declared = set(data["sources"])
    for name, chip in data["chips"].items():
        family = data["families"][chip["family"]]
        assert {"cube_dtypes", "bf16", "precision_mode"} <= set(family), name
        for rule in family["rules"]:
            assert set(rule["sources"]) <= declared and rule["fix"], rule["rule"]
    for rule in data["dtypes"]["rules"]:
        assert set(rule["sources"]) <= declared and rule["fix"], rule["rule"]
    assert data["families"]["910A"]["bf16"] is False and data["families"]["910B"]["bf16"] is True
    assert data["families"]["910B"]["hf32_defaults"] == {"matmul": False, "conv": True}


@pytest.fixture(scope="module")
def mlp_scans(tmp_path_factory) -> dict:
    out = {}
    for chip in ("910A", "910B2"):
        path = tmp_path_factory.mktemp(f"bf16_{chip}")
        proc = run_opscope("scan", MLP, "--chip", chip, "--steps", "3", "--out", path, "--format", "", "--",
                           "--uint64")
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[chip] = (load_scan(path), proc.stdout)
    return out


def _chip_findings(scan: dict) -> dict:
    return {(f["rule"], f["line"]): f for f in scan["findings"] if f["rule"].startswith("chip-dtype")}


def test_scan_of_a_bf16_mlp_names_the_bf16_problem_and_fp16_fix_on_910a_only(mlp_scans):
    scan_a, stdout_a = mlp_scans["910A"]
    scan_b, _ = mlp_scans["910B2"]
    assert scan_a["settings"]["chip"] == "Ascend910A" and scan_b["settings"]["chip"] == "Ascend910B2"
    lines = Path(MLP).read_text().splitlines()
    model_line = next(i for i, text in enumerate(lines, 1) if "out = model(x)" in text)
    bf16 = _chip_findings(scan_a)[("chip-dtype-bf16", model_line)]
    assert bf16["severity"] == "error" and "mm" in bf16["message"]
    assert "torch.float16" in bf16["replacement"] and "GradScaler('npu')" in bf16["replacement"]
    assert "GradScaler('npu')" in stdout_a            # the terminal report shows the fix
    assert not any(rule == "chip-dtype-bf16" for rule, _ in _chip_findings(scan_b))
    assert scan_a["summary"]["findings_by_severity"]["error"] > scan_b["summary"]["findings_by_severity"]["error"]


def test_scan_flags_the_float64_cumsum_and_uint64_counter_in_the_loop_on_both_chips(mlp_scans):
    lines = Path(MLP).read_text().splitlines()
    cumsum_line = next(i for i, text in enumerate(lines, 1) if "running = torch.cumsum" in text)
    uint_line = next(i for i, text in enumerate(lines, 1) if "torch.uint64" in text)
    for chip in ("910A", "910B2"):
        found = _chip_findings(mlp_scans[chip][0])
        assert "cumsum" in found[("chip-dtype-float64", cumsum_line)]["message"], chip
        assert "uint64" in found[("chip-dtype-uint", uint_line)]["message"], chip


def test_scan_with_an_unknown_chip_exits_2_with_one_line_listing_the_known_chips(tmp_path):
    proc = run_opscope("scan", MLP, "--chip", "910Z", "--steps", "2", "-o", tmp_path / "x", "-q")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if "unknown chip" in line]
    assert len(error) == 1 and "'910Z'" in error[0]
    assert all(name in error[0] for name in ("Ascend910A", "Ascend910B1", "Ascend910B4"))


def test_report_for_another_chip_judges_its_dtypes_and_memory_again(tmp_path):
    """`opscope report RUN --chip 910A` of a 910B2 scan: the bf16 error appears, the score follows."""
    run = tmp_path / "b2"
    proc = run_opscope("scan", MLP, "--chip", "910B2", "--steps", "3", "--out", run, "--format", "", "--", "--uint64")
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = load_scan(run)
    assert not any(f["rule"] == "chip-dtype-bf16" for f in before["findings"])
    proc = run_opscope("report", run, "--chip", "910A", "--format", "json", "-o", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = load_scan(tmp_path / "a")
    assert any(f["rule"] == "chip-dtype-bf16" for f in after["findings"])
    assert after["npu_estimate"]["chip"] == "Ascend910A"
    assert after["summary"]["readiness_score"] < before["summary"]["readiness_score"]


def test_a_memory_fit_is_judged_again_for_another_chips_hbm():
    from opscope.analysis.npu.memory_fit import for_chip, memory_fit
    gib = 2 ** 30
    record = {"steps": [{"step": 2, "bytes": 40 * gib, "phase": "backward",
                         "breakdown": {"parameters": 6 * gib, "gradients": 6 * gib, "optimizer_state": 12 * gib},
                         "end_breakdown": {"parameters": 6 * gib, "gradients": 6 * gib, "optimizer_state": 12 * gib}}]}
    fit = memory_fit(record, "Ascend910B2")   # 64 GiB
    b2, b4 = fit.to_dict(), for_chip(fit, "Ascend910B4").to_dict()   # 32 GiB; as scan.json holds them
    assert b2["fits_one_card"] and not b4["fits_one_card"]
    assert b4["parts"] == b2["parts"] and b4["peak_bytes"] == b2["peak_bytes"] == 40 * gib
    assert b4["chip"] == "Ascend910B4" and b4["cards"]["zero3"]["cards"] > 1


def test_operators_that_never_run_on_the_npu_are_not_flagged():
    """A not-applicable operator (the scanning machine's own kernel inside a public one) is no dtype problem."""
    from opscope.analysis.verdicts.chip_dtypes import chip_dtype_findings
    from opscope.model import Operator
    inside = Operator(name="aten::mm", overload=None, input_shapes=[[8, 8], [8, 8]], dtypes=["double", "double"],
                      phase="forward", source="t.py:3", calls=2, verdict="not-applicable")
    assert chip_dtype_findings([inside], "Ascend910B2") == []
    inside.verdict = "native"
    assert [f.rule for f in chip_dtype_findings([inside], "Ascend910B2")] == ["chip-dtype-float64"]
