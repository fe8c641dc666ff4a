"""The NPU time estimate ("what will be slow on <chip>"), checked against the shared real
Ascend profiles: every expected figure is computed here from the raw CSVs."""
from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path

import pytest

from conftest import SCRIPTS, SHARED, load_scan, run_opscope
from opscope.model import EstimateBasis, Operator, Step

ALEX = SHARED / "data/ascend_profiles/alexnet_ddp_2rank/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT"
LLM = str(SHARED / "data/ascend_profiles/llm_megatron_4rank_level2/rank_{}_ascend_pt/ASCEND_PROFILER_OUTPUT")
needs_shared = pytest.mark.skipif(not (ALEX / "kernel_details.csv").exists(), reason="../shared profiles absent")
CUBE = {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "MatMulV2", "MatMulV3"}


def _raw(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def test_chip_and_cost_model_data_load_with_their_schema_and_cite_sources():
    from opscope import knowledge
    chips = knowledge.load("npu_chips.yaml")
    model = knowledge.load("npu_cost_model.yaml")
    assert {"Ascend910A", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4"} <= set(chips["chips"])
    for name, chip in chips["chips"].items():
        for key in ("ai_cores", "cube_tflops", "vector_tflops_fp16", "hbm_gbps", "hbm_gib", "link_gbps", "confidence"):
            assert key in chip, (name, key)
        assert chip["cube_tflops"]["fp16"] > 0 and chip["hbm_gbps"] > 0
    text = (Path(knowledge.__file__).parents[1] / "support_matrix" / "npu_chips.yaml").read_text()
    for source in chips["sources"]:   # every declared source is cited by at least one figure
        assert text.count(source) >= 2, source
    for op, entry in model["aten"].items():   # every ATen mapping names a pricing function
        from opscope.analysis.npu.estimate import MODELS
        assert entry["model"] in MODELS, op


def test_unknown_chip_is_a_one_line_error(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "train_slow_on_npu.py", "--chip", "910Z", "-o", tmp_path / "x", "-q")
    assert proc.returncode == 2
    assert "unknown chip '910Z'" in proc.stderr and "Traceback" not in proc.stderr


@needs_shared
def test_kernel_details_reader_matches_the_raw_csv():
    from opscope.parsers.ascend_kernels import read_kernel_details
    raw = _raw(Path(LLM.format(0)) / "kernel_details.csv")
    rows = read_kernel_details(Path(LLM.format(0)) / "kernel_details.csv")
    assert len(rows) == len(raw)
    assert math.isclose(sum(r.duration_us for r in rows), sum(float(r["Duration(us)"]) for r in raw), rel_tol=1e-9)
    first = raw[0]
    assert rows[0].type == first["Type"] and rows[0].input_shapes == [
        [int(d) for d in part.split(",")] for part in first["Input Shapes"].strip('"').split(";")]


@needs_shared
@pytest.mark.parametrize("rank", [0, 2])
def test_llm_kernels_predicted_from_type_shapes_dtypes_within_2x(rank):
    """Rank 2 was not used to fit the cost model: a held-out check."""
    from opscope.analysis.npu.cost import kernel_from_row, kernel_time_us, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    raw = _raw(Path(LLM.format(rank)) / "kernel_details.csv")
    cube_cores = max(int(r["Block Dim"]) for r in raw if r["Accelerator Core"] == "AI_CORE")
    chip = next(figures for _, figures in [resolve_chip(n) for n in ("910B2", "910B3")]
                if figures["ai_cores"] == cube_cores)
    computing = sum(float(r["Duration(us)"]) for r in raw if not r["Type"].startswith("hcom_"))
    within, total, logs = 0.0, 0.0, []
    for row, real in zip(read_kernel_details(Path(LLM.format(rank)) / "kernel_details.csv"), raw):
        kernel = kernel_from_row(row)
        if real["Accelerator Core"] in ("HCCL", "COMMUNICATION") or real["Type"].startswith("hcom_"):
            continue
        ratio = math.log2(kernel_time_us(kernel, chip) / float(real["Duration(us)"]))
        logs.append(abs(ratio))
        total += float(real["Duration(us)"])
        within += float(real["Duration(us)"]) if abs(ratio) <= 1 else 0.0
    assert math.isclose(total, computing)   # every computing kernel was priced
    assert within / total >= 0.80
    assert statistics.median(logs) <= 0.6


def _alexnet_operators(batch: int = 32) -> list[Operator]:
    """AlexNet (torchvision layout) trained with SGD momentum + weight decay: one step's operator
    signatures, built from the layer shapes like a CPU scan records them."""
    ops: list[Operator] = []

    def op(name, shapes, phase, calls=1, dtypes=None, scalars=None, parent=None):
        same = next((o for o in ops if (o.name, o.input_shapes, o.phase) == (name, shapes, phase)), None)
        if same is not None:   # one signature per distinct call, as a scan aggregates them
            same.calls += calls
            return
        ops.append(Operator(name=name, input_shapes=shapes, dtypes=dtypes or ["float"] * len(shapes),
                            scalars=scalars or [], phase=phase, calls=calls, steps=[2], parent=parent,
                            source="train.py:1", verdict="native"))

    convs = [(3, 64, 11, 4, 2, 224, True), (64, 192, 5, 1, 2, 27, True), (192, 384, 3, 1, 1, 13, False),
             (384, 256, 3, 1, 1, 13, False), (256, 256, 3, 1, 1, 13, True)]
    params = []
    for cin, cout, k, s, p, size, pool in convs:
        out = (size + 2 * p - k) // s + 1
        x, w, y = [batch, cin, size, size], [cout, cin, k, k], [batch, cout, out, out]
        op("aten::convolution", [x, w, [cout]], "forward",
           scalars=[None, None, None, [s, s], [p, p], [1, 1], False, [0, 0], 1])
        op("aten::relu_", [y], "forward")
        op("aten::threshold_backward", [y, y, []], "backward", dtypes=["float", "float", "Scalar"])
        mask = [cin != 3, True, True]
        op("aten::convolution_backward", [y, x, w], "backward", scalars=[None] * 10 + [mask])
        if pool:
            pooled = [batch, cout, (out - 3) // 2 + 1, (out - 3) // 2 + 1]
            op("aten::max_pool2d_with_indices", [y, [], [], [], [], []], "forward",
               dtypes=["float"] + ["ScalarList"] * 5, scalars=[None, [3, 3], [2, 2], [0, 0], [1, 1], False])
            op("aten::max_pool2d_with_indices_backward", [pooled, y, [], [], [], [], [], []], "backward",
               dtypes=["float", "float"] + ["ScalarList"] * 6)
        params += [w, [cout]]
    op("aten::_adaptive_avg_pool2d", [[batch, 256, 6, 6], []], "forward", dtypes=["float", "ScalarList"])
    op("aten::_adaptive_avg_pool2d_backward", [[batch, 256, 6, 6], [batch, 256, 6, 6]], "backward")
    for k, n, relu in ((9216, 4096, True), (4096, 4096, True), (4096, 1000, False)):
        if relu:
            op("aten::dropout", [[batch, k], [], []], "forward", dtypes=["float", "Scalar", "Scalar"])
        op("aten::linear", [[batch, k], [n, k], [n]], "forward")
        op("aten::mm", [[batch, n], [n, k]], "backward")
        op("aten::mm", [[n, batch], [batch, k]], "backward")
        op("aten::sum", [[batch, n], [], [], []], "backward", dtypes=["float", "ScalarList", "Scalar", ""])
        if relu:
            op("aten::relu_", [[batch, n]], "forward")
            op("aten::threshold_backward", [[batch, n], [batch, n], []], "backward",
               dtypes=["float", "float", "Scalar"])
        params += [[n, k], [n]]
    op("aten::_log_softmax", [[batch, 1000], [], []], "forward", dtypes=["float", "Scalar", "Scalar"])
    op("aten::nll_loss_forward", [[batch, 1000], [batch], [], [], []], "forward",
       dtypes=["float", "long int", "", "Scalar", "Scalar"])
    op("aten::nll_loss_backward", [[], [batch, 1000], [batch], [], [], [], []], "backward",
       dtypes=["float", "float", "long int", "", "Scalar", "Scalar", "float"])
    op("aten::_log_softmax_backward_data", [[batch, 1000], [batch, 1000], [], []], "backward",
       dtypes=["float", "float", "Scalar", "Scalar"])
    for shape in params:   # SGD: grad += wd * p; buf = m * buf + grad; p -= lr * buf
        op("aten::add", [shape, shape, []], "optimizer", dtypes=["float", "float", "Scalar"])
        op("aten::mul_", [shape, []], "optimizer", dtypes=["float", "double"])
        op("aten::add_", [shape, shape, []], "optimizer", calls=2, dtypes=["float", "float", "Scalar"])
    return ops


@needs_shared
def test_alexnet_step_estimate_matches_the_real_npu_run():
    """Shares and totals of the 910B AlexNet b32 run, rank 0 (DDP over 2), from its raw CSVs."""
    from opscope.analysis.npu.estimate import build_basis, price
    kernels = [r for r in _raw(ALEX / "kernel_details.csv") if not r["Type"].startswith("hcom_")]
    total = sum(float(r["Duration(us)"]) for r in kernels)
    cube_share = sum(float(r["Duration(us)"]) for r in kernels if r["Type"] in CUBE) / total
    transdata = [r for r in kernels if r["Type"] == "TransData"]
    transdata_share = sum(float(r["Duration(us)"]) for r in transdata) / total
    computing = float(_raw(ALEX / "step_trace_time.csv")[0]["Computing"])

    basis = build_basis(_alexnet_operators(), [Step(index=1), Step(index=2)])
    est = price(basis, "Ascend910B2", world_sizes=[1, 2])
    step = est.step
    predicted_cube = sum(v for k, v in step.kernel_types_us.items() if k in CUBE | {"BatchMatMulV2"})
    two = step.world(2)   # the measured run: DDP over 2 NPUs
    assert two is not None and two.device_us is not None
    assert step.transdata_kernels == len(transdata)
    assert abs(two.device_us / computing - 1) <= 0.30
    assert abs(step.transdata_us / two.device_us - transdata_share) <= 0.05
    assert abs(predicted_cube / two.device_us - cube_share) <= 0.10
    assert two.bound != "compute"
    assert step.gradient_bytes == sum(math.prod(s) for s in [r for r in _alexnet_param_shapes()]) * 4
    assert step.batch == 32


def _alexnet_param_shapes():
    convs = [(3, 64, 11), (64, 192, 5), (192, 384, 3), (384, 256, 3), (256, 256, 3)]
    fcs = [(9216, 4096), (4096, 4096), (4096, 1000)]
    return [s for ci, co, k in convs for s in ([co, ci, k, k], [co])] + [s for k, n in fcs for s in ([n, k], [n])]


def test_910a_prices_matmul_format_conversions_and_a_slower_chip_is_slower():
    from opscope.analysis.npu.estimate import build_basis, price
    basis = build_basis(_alexnet_operators(batch=8), [Step(index=1), Step(index=2)])
    b2, b4, a = (price(basis, chip).step for chip in ("910B2", "910B4", "910A"))
    assert b4.device_us > b2.device_us             # half the HBM bandwidth, fewer cores
    assert a.kernel_types_us.get("TransData", 0) > 0   # ND <-> FRACTAL_NZ around each matmul
    assert a.device_us > b2.device_us


@pytest.fixture(scope="module")
def slow_scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("slow_on_npu")
    proc = run_opscope("scan", SCRIPTS / "train_slow_on_npu.py", "--steps", "3", "-o", out,
                       "--format", "html,xlsx,md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc.stdout


def _line(text: str) -> str:
    lines = (SCRIPTS / "train_slow_on_npu.py").read_text().splitlines()
    return f"train_slow_on_npu.py:{next(i for i, line in enumerate(lines, start=1) if text in line)}"


def test_slow_patterns_are_named_at_their_lines_above_the_convolutions(slow_scan):
    out, _ = slow_scan
    rows = load_scan(out)["npu_estimate"]["rows"]
    rank = {i: r for i, r in enumerate(rows)}
    conv = min(i for i, r in rank.items() if r["operator"].startswith("aten::convolution"))

    def first(predicate):
        return next(i for i, r in rank.items() if predicate(r))

    attention = first(lambda r: "npu_fusion_attention" in r["operator"])
    assert rank[attention]["source"] == _line("torch.matmul(q, k.transpose")
    rms = first(lambda r: "npu_rms_norm" in r["operator"])
    assert rank[rms]["source"] == _line("x.pow(2).mean")
    aicpu = first(lambda r: "AI CPU" in r["reason"])
    assert rank[aicpu]["source"] == _line("x[:, pad_index] = 0.0") and "int64" in rank[aicpu]["reason"]
    aligned = first(lambda r: r["kind"] == "pattern" and "K=1000" in r["operator"])
    assert rank[aligned]["source"] == _line("self.fc2(torch.relu")
    # the unaligned row weighs what the penalty adds (what aligning saves), not the matmuls' whole time
    assert 0 < rank[aligned]["npu_time_us"] < sum(r["npu_time_us"] for r in rows if r["kind"] == "operator"
                                                   and r["source"] == rank[aligned]["source"])
    assert max(attention, rms, aicpu) < conv
    step = load_scan(out)["npu_estimate"]["step"]
    assert step["per_world_size"][0]["bound"] == "aicpu"   # the IndexPut dominates the step


def test_every_report_has_the_estimate_section_right_after_the_fixes(slow_scan):
    out, stdout = slow_scan
    fixes = stdout.find("What to change")
    fixes = fixes if fixes >= 0 else stdout.index("Nothing to change")   # no fix row: the line that says so
    assert fixes < stdout.index("What will be slow on Ascend910B2 (estimate)") < stdout.index("on this machine")
    md = (out / "report.md").read_text()
    assert md.index("## Top things to fix") < md.index("## What will be slow on Ascend910B2 (estimate)") \
        < md.index("## Operators that need work")
    assert "Calibration:" in md and re.search(r"\| 1 \| aten::index_put_ \|", md)
    html = (out / "report.html").read_text()
    assert html.index('id="fixes"') < html.index('id="npu-estimate"') < html.index('id="summary"')
    from openpyxl import load_workbook
    wb = load_workbook(out / "report.xlsx")
    assert wb.sheetnames.index("NPU estimate") == wb.sheetnames.index("Fixes") + (2 if "Plan" in wb.sheetnames else 1)
    cells = [c.value for row in wb["NPU estimate"].iter_rows() for c in row if c.value]
    assert any(str(v).startswith("calibration:") for v in cells) and "aten::index_put_" in cells


def test_report_reprices_for_another_chip_from_option_or_config(slow_scan, tmp_path):
    out, _ = slow_scan
    proc = run_opscope("report", out, "--chip", "910B4", "--format", "md", "-o", tmp_path / "b4")
    assert proc.returncode == 0, proc.stderr
    assert "What will be slow on Ascend910B4" in (tmp_path / "b4" / "report.md").read_text()
    (tmp_path / ".opscope.toml").write_text('chip = "910A"\n')
    proc = run_opscope("report", out, "--format", "md", "-o", tmp_path / "a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "What will be slow on Ascend910A" in (tmp_path / "a" / "report.md").read_text()


def test_load_gives_the_estimate_as_a_dataframe(slow_scan):
    import opscope
    out, _ = slow_scan
    frame = opscope.load(out).npu_estimate
    assert frame.attrs["chip"] == "Ascend910B2" and frame.attrs["estimate"] is True
    assert list(frame["npu_time_us"]) == sorted(frame["npu_time_us"], reverse=True)
    assert frame.iloc[0]["operator"] == "aten::index_put_"


@needs_shared
def test_diff_compares_the_estimate_with_a_kernel_details_only_export(slow_scan, tmp_path):
    """The shared LLM run has no trace_view.json/.db: diff reads its kernels and steps for the comparison."""
    import json
    out, _ = slow_scan
    llm_root = Path(LLM.format(0)).parents[1]
    proc = run_opscope("diff", out, llm_root, "-o", tmp_path / "d", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cmp = json.loads((tmp_path / "d" / "estimate_vs_npu.json").read_text())
    assert cmp["chip"] == "Ascend910B3"   # 20 cube cores in the profile's Block Dim
    with_kernels = [Path(LLM.format(r)) for r in (0, 2)]
    expected = []
    for folder in with_kernels:
        raw = _raw(folder / "kernel_details.csv")
        steps = {r["Step Id"] for r in raw}
        expected.append(sum(float(r["Duration(us)"]) for r in raw if r["Type"].startswith("MatMul")) / len(steps))
    matmul = next(r for r in cmp["families"] if r["family"] == "matmul")
    assert matmul["measured_us"] == pytest.approx(sum(expected) / len(expected), abs=0.1)
    computing = [float(_raw(Path(LLM.format(r)) / "step_trace_time.csv")[0]["Computing"]) for r in range(4)]
    row = next(r for r in cmp["steps"] if r["item"] == "computing")
    assert row["measured_us"] == pytest.approx(sum(computing) / 4, abs=0.1)
    assert row["ratio"] == pytest.approx(row["estimated_us"] / row["measured_us"], abs=0.01)
    assert cmp["devices"] == 4 and len(cmp["ranks"]) == 4


@needs_shared
def test_calibrate_fits_unit_factors_that_later_reports_use(slow_scan, tmp_path):
    import json

    from opscope.analysis.npu.cost import kernel_from_row, kernel_time_us, resolve_chip
    from opscope.parsers.ascend_kernels import read_kernel_details
    out, _ = slow_scan
    profile = Path(LLM.format(0))
    proc = run_opscope("calibrate", profile, "-o", tmp_path / "cal.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "cal.json").read_text())["chips"]["Ascend910B3"]
    _, chip = resolve_chip("910B3")
    raw = _raw(profile / "kernel_details.csv")
    cube = [(kernel_time_us(kernel_from_row(row), chip), float(real["Duration(us)"]))
            for row, real in zip(read_kernel_details(profile / "kernel_details.csv"), raw)
            if real["Accelerator Core"] == "AI_CORE"]
    factor = entry["units"]["cube"]["factor"]
    assert sum(p for p, _ in cube) * factor == pytest.approx(sum(m for _, m in cube), rel=1e-3)
    # ./opscope-calibration.json is found without --calibration; the factors are per chip
    (tmp_path / "cal.json").rename(tmp_path / "opscope-calibration.json")
    proc = run_opscope("report", out, "--chip", "910B3", "--format", "md", "-o", tmp_path / "r", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    assert "scaled by your own profiles" in md and f"cube x{factor:.2f}" in md


@needs_shared
def test_calibrate_fits_each_profile_to_the_chip_it_ran_on(tmp_path):
    """AlexNet ran on 24 AI cores (910B2), the LLM on 20 (910B3): one call with both writes one entry
    per chip, each fitted on its own kernels only (as if calibrated alone), whatever the order."""
    import json
    llm, alexnet = Path(LLM.format(0)), ALEX
    alone = {}
    for chip, profile in (("Ascend910B3", llm), ("Ascend910B2", alexnet)):
        out = tmp_path / f"{chip}.json"
        assert run_opscope("calibrate", profile, "-o", out, "-q", cwd=tmp_path).returncode == 0
        alone[chip] = json.loads(out.read_text())["chips"][chip]
    for i, order in enumerate(((llm, alexnet), (alexnet, llm))):
        out = tmp_path / f"both{i}.json"
        proc = run_opscope("calibrate", *order, "-o", out, "-q", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(out.read_text())["chips"] == alone


def test_report_estimates_a_scan_json_written_before_the_estimate_existed(slow_scan, tmp_path):
    import json
    out, _ = slow_scan
    data = json.loads((out / "scan.json").read_text())
    data.pop("npu_estimate")
    (tmp_path / "scan.json").write_text(json.dumps(data))
    proc = run_opscope("report", tmp_path, "--format", "md", "-q")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "report.md").read_text()
    assert "## What will be slow on Ascend910B2 (estimate)" in md and "aten::index_put_" in md


@pytest.mark.parametrize("dtype, slow", [("double", True), ("float", False), ("c10::BFloat16", False)])
def test_a_matmul_outside_the_cube_dtypes_falls_to_ai_cpu(dtype, slow):
    from opscope.analysis.npu.estimate import estimate
    op = Operator(name="aten::mm", input_shapes=[[1024, 1024], [1024, 1024]], dtypes=[dtype, dtype], phase="forward",
                  calls=1, steps=[2], source="train.py:3", verdict="native")
    row = estimate([op], [Step(index=1), Step(index=2)]).rows[0]
    assert ("AI CPU" in (row.reason or "")) is slow
    assert (row.aicpu_us > 0) is slow and (row.cube_us > 0) is not slow


def test_per_parameter_sgd_ops_become_one_optimizer_row_naming_the_fused_optimizer():
    from opscope.analysis.npu.estimate import build_basis, price
    rows = price(build_basis(_alexnet_operators(batch=8), [Step(index=1), Step(index=2)])).rows
    optimizer = [r for r in rows if r.operator.startswith("optimizer step")]
    assert len(optimizer) == 1 and "torch_npu.optim.NpuFusedSGD" in (optimizer[0].fix or "")
    members = [r for r in rows if r.phase == "optimizer" and r.kind == "operator"]
    assert optimizer[0].npu_time_us == pytest.approx(sum(r.npu_time_us for r in members), abs=0.1)


# --- issue #33: structural pricing errors (constructed signatures, not held-out numbers) ---

def _op(name, shapes, dtypes=None, phase="forward", parent=None, verdict="native", calls=1, scalars=None):
    return Operator(name=name, input_shapes=shapes, dtypes=dtypes or ["float"] * len(shapes), scalars=scalars or [],
                    phase=phase, calls=calls, steps=[2], parent=parent, source="train.py:7", verdict=verdict)


def _rows(ops):
    from opscope.analysis.npu.estimate import build_basis, price
    return [r.to_dict() for r in price(build_basis(ops, [Step(index=1), Step(index=2)]), "910B2").operator_rows()]


X = [64, 256, 56, 56]


def test_batch_norm_wrappers_are_priced_once_by_native_batch_norm():
    bn_args = [X, [256], [256], [256], [256], [], [], [], []]
    dtypes = ["float"] * 5 + ["Scalar"] * 4
    ops = [_op("aten::batch_norm", bn_args, dtypes, verdict="composite"),
           _op("aten::_batch_norm_impl_index", bn_args, dtypes, parent="aten::batch_norm", verdict="composite"),
           _op("aten::native_batch_norm", bn_args[:8], dtypes[:8], parent="aten::_batch_norm_impl_index")]
    rows = _rows(ops)
    assert [r["operator"] for r in rows] == ["aten::native_batch_norm"]
    assert "generic" not in rows[0]["kernels"]


def test_rms_norm_is_priced_by_its_children_not_on_top_of_them():
    x = [8, 4096, 4096]
    ops = [_op("aten::rms_norm", [x, [], [4096], []], ["float", "ScalarList", "float", ""], verdict="composite"),
           _op("aten::_fused_rms_norm", [x, [], [4096], []], ["float", "ScalarList", "float", ""],
               parent="aten::rms_norm", verdict="composite")]
    for child, shapes in (("aten::pow", [x, []]), ("aten::mean", [x, [], [], []]), ("aten::add", [[8, 4096, 1], []]),
                          ("aten::rsqrt", [[8, 4096, 1]]), ("aten::mul", [x, [8, 4096, 1]])):
        ops.append(_op(child, shapes, ["float"] + ["Scalar"] * (len(shapes) - 1) if child != "aten::mul" else None,
                       parent="aten::_fused_rms_norm"))
    rows = _rows(ops)
    names = {r["operator"].split(".")[0] for r in rows}
    assert names == {"aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul"}
    assert not any("generic" in r["kernels"] for r in rows)


def test_an_op_torch_npu_registers_is_priced_by_its_own_kernel_not_by_its_cpu_children():
    ops = [_op("aten::group_norm", [X, [], [256], [256], [], []], ["float", "Scalar", "float", "float", "Scalar",
               "Scalar"], verdict="composite"),
           _op("aten::native_group_norm", [X, [256], [256], [], [], [], [], []], ["float"] * 3 + ["Scalar"] * 5,
               parent="aten::group_norm"),
           _op("aten::mul", [X, X], parent="aten::native_group_norm"),      # the CPU kernel's own work
           _op("aten::adaptive_avg_pool3d", [[8, 64, 4, 32, 32], []], ["float", "ScalarList"], verdict="composite"),
           _op("aten::_adaptive_avg_pool3d", [[8, 64, 4, 32, 32], []], ["float", "ScalarList"],
               parent="aten::adaptive_avg_pool3d")]
    rows = _rows(ops)
    assert sorted(r["operator"] for r in rows) == ["aten::_adaptive_avg_pool3d", "aten::native_group_norm"]
    assert {r["kernels"] for r in rows} == {"GroupNorm", "AdaptiveAvgPool3d"}


@needs_shared
def test_the_composite_rule_agrees_with_op_plugin():
    """What the support matrix calls composite (priced by children) op-plugin does not register, and the
    operators priced by their own kernel it does."""
    text = (SHARED / "data/op_plugin/op_plugin_functions.yaml").read_text()

    def registered(name):
        return re.search(rf"func: {re.escape(name)}[.(]", text) is not None
    for name in ("batch_norm", "_batch_norm_impl_index", "rms_norm", "_fused_rms_norm", "group_norm"):
        assert not registered(name), name
    for name in ("native_batch_norm", "native_group_norm", "_adaptive_avg_pool3d", "upsample_nearest2d", "mish",
                 "maximum", "gather", "_foreach_norm", "_foreach_addcdiv", "_fused_adamw_"):
        assert registered(name), name
    from opscope.matrix.store import load_matrix   # the shipped matrix (what verdicts come from) agrees
    matrix = load_matrix()
    families = matrix.release(matrix.default_line).families()
    assert not {"batch_norm", "_batch_norm_impl_index", "rms_norm", "group_norm"} & set(families)
    assert {"native_batch_norm", "native_group_norm", "mish", "_fused_adamw_"} <= set(families)


BIG = [[8192, 8192]] * 4
BIG_BYTES = 4 * 8192 * 8192 * 4


def test_foreach_tensor_lists_with_recorded_shapes_are_priced_by_their_bytes():
    op = _op("aten::_foreach_add_", [BIG, BIG, []], ["TensorList", "TensorList", "Scalar"], phase="optimizer")
    row = _rows([op])[0]
    assert row["kernels"] == "ForeachAddList"
    assert row["npu_time_us"] > 3 * BIG_BYTES / 1600e9 * 1e6 * 0.5   # 3 passes over 1 GiB: hundreds of us


def test_foreach_tensor_lists_lost_by_the_profiler_are_recovered_from_the_per_tensor_calls():
    parent = _op("aten::_foreach_lerp_", [[], [], []], ["TensorList", "TensorList", "Scalar"], phase="optimizer",
                 calls=1)
    child = _op("aten::lerp_", [[8192, 8192], [8192, 8192], []], ["float", "float", "Scalar"], phase="optimizer",
                parent="aten::_foreach_lerp_", calls=4)
    row = _rows([parent, child])[0]
    assert row["operator"].startswith("aten::_foreach_lerp_")
    assert row["npu_time_us"] > 100


def test_a_fused_adamw_without_recorded_shapes_is_priced_over_the_parameters():
    lists = [[]] * 6 + [[]] * 9
    dtypes = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]
    fused = _op("aten::_fused_adamw_", lists, dtypes, phase="optimizer",
                scalars=[None] * 6 + [1e-3, 0.9, 0.999, 0.01, 1e-8, False, False, None, None])
    inits = [Operator(name="aten::zeros_like", input_shapes=[[8192, 8192], [], [], [], [], []],
                      dtypes=["float", "", "", "", "Scalar", "Scalar"], phase="optimizer", calls=8, steps=[1],
                      verdict="composite", source="train.py:9")]   # 2 states x 4 parameters, first step only
    row = next(r for r in _rows([fused, *inits]) if r["operator"].startswith("aten::_fused_adamw_"))
    assert row["kernels"] == "ApplyAdamWV2"
    assert row["npu_time_us"] > 7 * BIG_BYTES / 1600e9 * 1e6 * 0.3   # 4 lists read, 3 written


@pytest.mark.parametrize("name, kernel", [("aten::_foreach_addcdiv", "ForeachAddcdivScalarList"),
                                          ("aten::_foreach_norm", "ForeachNorm")])
def test_out_of_place_foreach_ops_have_kernels(name, kernel):
    shapes = [BIG, BIG, BIG, []] if "addcdiv" in name else [BIG, []]
    dtypes = ["TensorList"] * (len(shapes) - 1) + ["Scalar"]
    row = _rows([_op(name, shapes, dtypes, phase="optimizer")])[0]
    assert row["kernels"] == kernel and "generic" not in row["reason"] and row["npu_time_us"] > 50


# (ATen op, input dtype, the dtype a cast writes (torch ScalarType code) or None, AI CPU?)
AICPU_CASES = [("aten::_to_copy", "signed char", 5, False), ("aten::_to_copy", "signed char", 6, False),
               ("aten::_to_copy", "unsigned char", 5, False), ("aten::_to_copy", "bool", 6, False),
               ("aten::_to_copy", "short int", 6, True), ("aten::_to_copy", "float", 7, True),
               ("aten::_to_copy", "float", 15, False), ("aten::eq", "long int", None, False),
               ("aten::mul", "short int", None, True), ("aten::mul", "signed char", None, False),
               ("aten::add", "unsigned short", None, True), ("aten::add", "signed char", None, False),
               ("aten::add", "double", None, False), ("aten::mm", "double", None, True)]


@pytest.mark.parametrize("name, dtype, out, aicpu", AICPU_CASES)
def test_ai_cpu_dtype_rules_per_kernel_type(name, dtype, out, aicpu):
    shapes = [[1024, 1024], [], [], [], [], [], []] if name.endswith("_to_copy") else [[1024, 1024], [1024, 1024]]
    dtypes = [dtype, "Scalar", "", "", "", "Scalar", ""] if name.endswith("_to_copy") else [dtype, dtype]
    scalars = [None, out, None, None, None, False, None] if name.endswith("_to_copy") else []
    row = _rows([_op(name, shapes, dtypes, scalars=scalars)])[0]
    assert ("AI CPU" in row["reason"]) is aicpu, row["reason"]
    assert (row["aicpu_us"] > 0) is aicpu


def test_ai_cpu_rules_are_the_advisors_lists():
    """The shipped rules carry the advisor's DataTypeChecker lists (CANN 8.0) for each op type."""
    import yaml

    from opscope import knowledge
    rules = knowledge.load("npu_cost_model.yaml")["aicpu_rules"]["aicore_dtypes"]["8.0"]
    path = SHARED / "reference/msprof_analyze_advisor/rules/aicpu_rules.yaml"
    if not path.exists():
        pytest.skip("../shared advisor rules absent")
    spell = {"float": "float32", "dt_bf16": "bfloat16"}
    kernel = {"cast": "Cast", "equal": "Equal", "tensorequal": "TensorEqual", "mul": "Mul"}
    for item in yaml.safe_load(path.read_text())["CommonChecker"]:
        check = item["DataTypeChecker"]
        if "8.0.RC1" not in check["cann_version"]:
            continue
        expected = {spell.get(d, d) for d in check["input"]}
        for op_type in check["op_type"]:
            got = rules["default"] if op_type == "__ALL__" else rules["kernels"][kernel[op_type]]
            assert set(got) == expected, op_type


@pytest.mark.parametrize("name, shapes, dtypes, kernel", [
    ("aten::mish", [X], None, "Mish"), ("aten::maximum", [X, X], None, "Maximum"),
    ("aten::argmax", [[64, 1000], [], []], ["float", "Scalar", "Scalar"], "ArgMaxV2"),
    ("aten::gather", [[64, 1000], [], [64, 1], []], ["float", "Scalar", "long int", "Scalar"], "GatherElements"),
    ("aten::scatter_add_", [[64, 1000], [], [64, 1], [64, 1]], ["float", "Scalar", "long int", "float"],
     "ScatterElements"),
    ("aten::native_group_norm", [X, [256], [256], [], [], [], [], []], ["float"] * 3 + ["Scalar"] * 5, "GroupNorm"),
    ("aten::upsample_nearest2d", [X, [], [], []], ["float", "ScalarList", "Scalar", "Scalar"],
     "ResizeNearestNeighborV2"),
    ("aten::_foreach_norm", [BIG, []], ["TensorList", "Scalar"], "ForeachNorm"),
    # the torchvision mobile/efficient models' activations (a survey of 12 classifiers found them generic)
    ("aten::hardtanh_", [X, [], []], ["float", "Scalar", "Scalar"], "ClipByValue"),
    ("aten::hardtanh_backward", [X, X, [], []], ["float", "float", "Scalar", "Scalar"], "HardtanhGrad"),
    ("aten::hardswish_", [X], None, "HardSwish"), ("aten::hardswish_backward", [X, X], None, "HardSwishGrad"),
    ("aten::hardsigmoid", [X], None, "HardSigmoid"), ("aten::silu_", [X], None, "Swish"),
    ("aten::sigmoid_backward", [X, X], None, "SigmoidGrad")])
def test_operators_that_were_priced_generic_map_to_their_kernels(name, shapes, dtypes, kernel):
    row = _rows([_op(name, shapes, dtypes)])[0]
    assert row["kernels"] == kernel and "no kernel mapping" not in row["reason"]


def test_upsampling_writes_its_output_size_not_its_input_size():
    from opscope.analysis.npu.estimate import build_basis
    x = [16, 64, 64, 64]
    by_size = _op("aten::upsample_nearest2d", [x, [], [], []], ["float", "ScalarList", "Scalar", "Scalar"],
                  scalars=[None, [256, 256], 4.0, 4.0])
    by_scale = _op("aten::upsample_nearest2d", [x, [], []], ["float", "", "ScalarList"],
                   scalars=[None, None, [4.0, 4.0]])
    for op in (by_size, by_scale):
        kernel = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]["kernels"][0]
        assert kernel["bytes"] == (math.prod(x) + 16 * 64 * 256 * 256) * 4


def test_decode_attention_reads_k_and_v_once_and_is_not_an_unaligned_sequence():
    """Class 7 of issue 33: a query of length 1 against a 4096-long cache reads K and V once (they dominate)
    and writes one row; no 'unaligned S=1' penalty."""
    from opscope.analysis.npu.estimate import build_basis
    b, h, t, d = 8, 32, 4096, 128
    q, kv = [b, h, 1, d], [b, h, t, d]
    op = _op("aten::scaled_dot_product_attention", [q, kv, kv, [], [], [], []],
             ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", ""], scalars=[None, None, None, None, 0.0, False, None])
    row = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]
    kernel = row["kernels"][0]
    assert kernel["type"] == "FlashAttentionScore"
    assert kernel["bytes"] == (2 * b * h * 1 * d + 2 * b * h * t * d) * 2   # q and its output, K and V once
    assert not any(r["kind"] == "alignment" for r in row["reasons"])


def test_attention_gradient_reads_its_inputs_and_writes_dq_dk_dv():
    from opscope.analysis.npu.estimate import build_basis
    x = [4, 16, 1024, 128]
    op = _op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [x, x, x, x, x, [4, 16, 1024]],
             ["float"] * 6, phase="backward")
    kernel = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]["kernels"][0]
    n = math.prod(x)
    assert kernel["type"] == "FlashAttentionScoreGrad"
    assert kernel["bytes"] == (5 * n + 4 * 16 * 1024 + 3 * n) * 4
    assert kernel["flops"] == 4.0 * n * 1024 * 2.5


def test_every_operator_row_names_the_kernel_and_the_rule_that_priced_it():
    rows = _rows([_op("aten::mm", [[512, 1024], [1024, 1024]]), _op("aten::add", [X, X]),
                  _op("aten::mish", [X]), _op("aten::index_put_", [X, [], X], verdict="cpu-fallback")])
    for row in rows:
        kernel = row["kernels"].split(", ")[0]
        assert row["priced_by"].split(": ")[0] in (kernel, "CPU fallback"), row
    mm = next(r for r in rows if r["operator"] == "aten::mm")
    assert "GFLOP at fp32" in mm["priced_by"] and "TFLOPS" in mm["priced_by"]
    add = next(r for r in rows if r["operator"] == "aten::add")
    assert " GB/s" in add["priced_by"]
    fallback = next(r for r in rows if r["operator"] == "aten::index_put_")
    assert fallback["priced_by"].startswith("CPU fallback: this machine's CPU time")


def test_a_densenet_class_step_of_thousands_of_launches_is_not_host_bound_when_its_kernels_take_longer():
    """Class 5 of issue 33: the launch thread's cost per aclnn operator (27 us, the shared AlexNet run's mean
    under the profiler), not the mean over every launch including the single-op compile path (127 us)."""
    from opscope.analysis.npu.estimate import build_basis, price
    from opscope.knowledge import load
    host = load("npu_cost_model.yaml")["host"]
    assert host["launch_us_per_op"] < 40 and "aclnn" in host["source"]
    conv = _op("aten::convolution", [[64, 128, 14, 14], [32, 128, 3, 3], [], [], [], [], [], [], []],
               ["float"] * 3 + ["Scalar"] * 6, calls=3600, scalars=[None, None, None, [1, 1], [1, 1], [1, 1], False,
                                                                    [0, 0], 1])
    step = price(build_basis([conv], [Step(index=1), Step(index=2)]), "Ascend910B2").step
    one = step.per_world_size[0]
    assert step.host_us == pytest.approx(3600 * host["launch_us_per_op"], rel=0.01)
    assert one.bound != "host" and (one.device_us or 0) > step.host_us


def test_conv_format_conversions_are_priced_each_call_on_910b_and_persist_on_910a():
    """Class 4 of issue 33: the shared 910B run converts around every convolution and pooling each step (57 = 57);
    on a 910A torch_npu's documented default keeps NC1HWC0 / FRACTAL_Z between them (allow_internal_format)."""
    from opscope.analysis.npu.estimate import build_basis, price
    basis = build_basis(_alexnet_operators(batch=8), [Step(index=1), Step(index=2)])
    b2, a = (price(basis, chip) for chip in ("910B2", "910A"))
    conv_rows = lambda est: [r for r in est.operator_rows() if "Conv2D" in r.kernels]  # noqa: E731
    assert all(r.transdata_us > 0 for r in conv_rows(b2))
    assert all(r.transdata_us == 0 and "TransData per call" not in (r.reason or "") for r in conv_rows(a))
    # the matmuls still convert to FRACTAL_NZ on the 910A
    assert any(r.transdata_us > 0 for r in a.operator_rows() if "MatMul" in r.kernels)
    # a basis stored before the rule was named is priced as it was (conversions on every chip)
    old = basis.to_dict()
    old["rows"] = [{k: v for k, v in r.items() if k != "transdata_rule"} for r in old["rows"]]
    assert price(EstimateBasis.from_dict(old), "910A").step.transdata_kernels > a.step.transdata_kernels


# --- issue #33 class 6: a vector kernel re-run on tensors within L2 reads them from there ---

def test_a_vector_kernel_re_run_on_tensors_that_fit_l2_reads_them_from_l2():
    from opscope.analysis.npu.cost import Kernel, kernel_time_us, pricing_rule, resolve_chip
    _, b2 = resolve_chip("910B2")
    _, a910 = resolve_chip("910A")
    mb24 = 3 * 2 ** 23   # x + y read, the sum written: 8 MiB each, 24 MiB in all (the L2 is 192 MiB)
    cold = Kernel("Add", "vector", bytes=mb24, written=mb24 / 3)
    warm = Kernel("Add", "vector", bytes=mb24, written=mb24 / 3, warm=1.0)
    ratio = kernel_time_us(cold, b2) / kernel_time_us(warm, b2)
    # reads at l2_read_rate / ddr_rate = 3.44x, writes at the kernel's own rate: about 1.8x for an Add
    assert 1.6 < ratio < 2.1, ratio
    assert "L2: reads at 3.44x" in pricing_rule(warm, b2) and "L2" not in pricing_rule(cold, b2)
    big = Kernel("Add", "vector", bytes=300 * 2 ** 20, written=100 * 2 ** 20, warm=1.0)
    assert kernel_time_us(big, b2) == kernel_time_us(Kernel("Add", "vector", bytes=big.bytes, written=big.written),
                                                     b2)   # larger than the L2: streamed from HBM
    assert kernel_time_us(warm, a910) == kernel_time_us(cold, a910)   # no public L2 figure for the 910
    half = Kernel("Add", "vector", bytes=mb24, written=mb24 / 3, warm=0.5)
    assert kernel_time_us(half, b2) == pytest.approx((kernel_time_us(cold, b2) + kernel_time_us(warm, b2)) / 2)


def test_every_910b_chip_has_its_l2_size_with_a_source():
    from opscope.analysis.npu.cost import chips, cost_model
    data = chips()
    for name, figures in data["chips"].items():
        if figures["family"] == "910B":
            assert figures["l2_mib"] in (96, 192), name
    assert "l2_size" in data["sources"]["cann_l2"]
    assert "l2_read_rate=110" in cost_model()["l2"]["source"]


def _call(name, shapes, parent=None, phase="forward", source="bench.py:9", step=2, count=1, repeats=0):
    from opscope.model import OpCall
    return OpCall(name=name, input_shapes=shapes, dtypes=["float"] * len(shapes), phase=phase, parent=parent,
                  source=source, step=step, count=count, repeats=repeats)


def test_capture_counts_calls_that_re_ran_the_call_before_them():
    from opscope.capture.events import compact_calls
    x = [4, 512, 1024]
    shared: dict = {}
    calls = compact_calls([_call("aten::layer_norm", [x]), _call("aten::native_layer_norm", [x], "aten::layer_norm"),
                           _call("aten::layer_norm", [x]), _call("aten::native_layer_norm", [x], "aten::layer_norm"),
                           _call("aten::relu", [x], source="bench.py:10"),
                           _call("aten::layer_norm", [x])], shared)
    by_name = {c.name: c for c in calls}
    assert (by_name["aten::layer_norm"].count, by_name["aten::layer_norm"].repeats) == (3, 1)
    assert (by_name["aten::native_layer_norm"].count, by_name["aten::native_layer_norm"].repeats) == (2, 1)
    assert by_name["aten::relu"].repeats == 0
    # a step of one call re-runs the last call of the step before it (a benchmark loop, one call per step)
    later = compact_calls([_call("aten::layer_norm", [x], step=3)], shared)
    assert later[0].repeats == 1


def test_only_forward_repeats_are_priced_from_l2():
    from opscope.analysis.npu.estimate import build_basis, price
    x = [4, 512, 1024]
    ops = [_op("aten::add", [x, x], calls=10), _op("aten::add_", [x, x], phase="optimizer", calls=10)]
    calls = [_call("aten::add", [x, x], count=10, repeats=9),
             _call("aten::add_", [x, x], phase="optimizer", count=10, repeats=9)]
    basis = build_basis(ops, [Step(index=1), Step(index=2)], calls)
    warm = {r["name"]: r["kernels"][0].get("warm", 0.0) for r in basis.rows}
    assert warm == {"aten::add": 0.9, "aten::add_": 0.0}
    rows = {r.operator: r for r in price(basis, "910B2").operator_rows()}
    assert "90% of launches re-run on tensors in the 192 MiB L2" in (rows["aten::add"].priced_by or "")


def test_profile_kernels_mark_a_kernel_that_repeats_the_one_before():
    from opscope.analysis.npu.cost import profile_kernels
    from opscope.parsers.ascend_kernels import KernelRow

    def row(kind, shape):
        return KernelRow(name=kind, type=kind, core="AI_VECTOR_CORE", duration_us=10.0, input_shapes=[shape, shape],
                         input_dtypes=["FLOAT", "FLOAT"], output_shapes=[shape], output_dtypes=["FLOAT"])
    kernels = profile_kernels([row("Add", [1024, 1024]), row("Add", [1024, 1024]), row("Mul", [1024, 1024]),
                               row("Add", [1024, 1024])])
    assert [k.warm for k in kernels] == [0.0, 1.0, 0.0, 0.0]


def test_a_per_operator_benchmark_script_is_priced_from_l2_and_a_training_step_is_not(tmp_path, cnn_scan):
    out = tmp_path / "bench"
    proc = run_opscope("scan", SCRIPTS / "op_benchmark.py", "--steps", "6", "--step-marker", "module", "--out", out,
                       "--format", "json", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    add = next(r for r in load_scan(out)["npu_estimate"]["rows"] if r["operator"].startswith("aten::add"))
    assert "100% of launches re-run on tensors in the 192 MiB L2" in add["priced_by"], add
    assert add["npu_time_us"] < 0.6 * (1 + 3 * 2 ** 23 / 793e3), add   # below the HBM-rate price of 25.2 MB
    warm = [k for r in load_scan(cnn_scan)["npu_estimate"]["basis"]["rows"] for k in r["kernels"] if k.get("warm")]
    assert warm == []


def test_batch_norm_and_dropout_kernels_move_what_their_prototypes_read_and_write():
    """A two-kernel batch norm reads and writes the activation 3 times forward (BNTrainingReduce reads x;
    BNTrainingUpdate reads x, writes y) and 5 times backward (BNTrainingUpdateGrad reads dy and x;
    BNTrainingReduceGrad reads dy and x, writes dx), not 4 and 6; dropout's mask is one bit per element."""
    from opscope.analysis.npu.estimate import build_basis
    x = [64, 256, 56, 56]
    size = math.prod(x) * 4
    forward = _op("aten::native_batch_norm", [x, [256], [256], [256], [256], [], [], []],
                  ["float"] * 5 + ["Scalar"] * 3)
    backward = _op("aten::native_batch_norm_backward", [x, x, [256], [256], [256], [256], [256], [], [], []],
                   ["float"] * 7 + ["Scalar", "Scalar", "ScalarList"], phase="backward")
    dropout = _op("aten::native_dropout", [x, [], []], ["float", "Scalar", "Scalar"])
    rows = {r["name"]: r["kernels"] for r in build_basis([forward, backward, dropout],
                                                         [Step(index=1), Step(index=2)]).rows}
    assert [(k["type"], k["bytes"] / size) for k in rows["aten::native_batch_norm"]] == \
        [("BNTrainingReduce", 1.0), ("BNTrainingUpdate", 2.0)]
    assert [(k["type"], k["bytes"] / size) for k in rows["aten::native_batch_norm_backward"]] == \
        [("BNTrainingUpdateGrad", 2.0), ("BNTrainingReduceGrad", 3.0)]
    gen, do_mask = rows["aten::native_dropout"]
    assert gen["bytes"] == math.prod(x) / 8 and do_mask["bytes"] == 2 * size + math.prod(x) / 8


def test_fp32_cube_kernels_run_in_the_dtype_the_chip_defaults_to():
    """fp32 convolutions run in HF32 on a 910B (conv.allow_hf32 defaults True) and fp32 matmuls in fp32;
    on a 910A both run in fp16 (allow_fp32_to_fp16): priced at that dtype's peak."""
    from opscope.analysis.npu.cost import Kernel, cube_run, kernel_time_us, pricing_rule, resolve_chip
    _, b2 = resolve_chip("910B2")
    _, a910 = resolve_chip("910A")
    conv = Kernel("Conv2D", "cube", flops=50e9, bytes=1e6, dtype="float32")
    mm = Kernel("MatMulV2", "cube", flops=50e9, bytes=1e6, dtype="float32")
    assert cube_run(conv, b2)[:2] == ("hf32", 176.9) and cube_run(mm, b2)[:2] == ("fp32", 88.5)
    assert cube_run(conv, a910)[:2] == ("fp16", 256.0) and cube_run(mm, a910)[:2] == ("fp16", 256.0)
    half = Kernel("Conv2D", "cube", flops=50e9, bytes=1e6, dtype="float16")
    assert kernel_time_us(conv, a910) == kernel_time_us(half, a910)
    assert "fp16 (the chip's default for fp32) 256 TFLOPS" in pricing_rule(conv, a910)


def test_report_target_keeps_what_the_scan_read_from_its_op_stream(slow_scan, tmp_path):
    """`report --target` rebuilds the basis from the stored operators; the op stream is not stored, so the
    fused-pattern reasons and the L2 re-run shares it gave are carried over, not lost."""
    out, _ = slow_scan
    proc = run_opscope("report", out, "--target", "2.6.0", "--format", "json", "--out", tmp_path / "re", "--quiet")
    assert proc.returncode == 0, proc.stderr

    def unfused(run):
        return sorted(r["operator"] for r in load_scan(run)["npu_estimate"]["rows"]
                      if "unfused" in (r.get("reason_kinds") or []))
    assert unfused(out) and unfused(tmp_path / "re") == unfused(out)
    bench = tmp_path / "bench"
    assert run_opscope("scan", SCRIPTS / "op_benchmark.py", "--steps", "4", "--step-marker", "module", "--out", bench,
                       "--format", "json", "--quiet").returncode == 0
    proc = run_opscope("report", bench, "--target", "2.6.0", "--format", "json", "--out", tmp_path / "re2", "--quiet")
    assert proc.returncode == 0, proc.stderr
    add = next(r for r in load_scan(tmp_path / "re2")["npu_estimate"]["rows"] if r["operator"].startswith("aten::add"))
    assert "re-run on tensors in the 192 MiB L2" in add["priced_by"]


def test_a_rate_above_hbm_holds_only_for_a_kernel_within_l2():
    """Relu's fitted rate (3,313 GB/s on a 1,600 GB/s chip) was reached on AlexNet activations held in L2: a
    Relu larger than the L2, or on a chip with no L2 figure (910A), moves at most the chip's HBM bandwidth."""
    from opscope.analysis.npu.cost import Kernel, kernel_time_us, pricing_rule, resolve_chip, vector_rate
    _, b2 = resolve_chip("910B2")
    _, a910 = resolve_chip("910A")
    small = Kernel("Relu", "vector", bytes=64e6)
    large = Kernel("Relu", "vector", bytes=822e6)
    assert vector_rate(small, b2) == (3313.0, False)
    assert vector_rate(large, b2) == (1600.0, True) and vector_rate(small, a910) == (1200.0, True)
    assert kernel_time_us(large, b2) == pytest.approx(2.0 + 822e6 / 1600e9 * 1e6)
    assert "the chip's HBM" in pricing_rule(large, b2) and "HBM" not in pricing_rule(small, b2)
    add = Kernel("Add", "vector", bytes=822e6)   # a rate below HBM is kept at any size
    assert vector_rate(add, b2) == (793.0, False)


def test_dropout_with_p_zero_or_outside_training_launches_nothing():
    from opscope.analysis.npu.estimate import build_basis
    x = [64, 197, 768]
    ops = [_op("aten::dropout", [x, [], []], ["float", "Scalar", "Scalar"], scalars=[None, 0.0, True]),
           _op("aten::dropout", [x + [2], [], []], ["float", "Scalar", "Scalar"], scalars=[None, 0.1, False]),
           _op("aten::dropout", [x + [3], [], []], ["float", "Scalar", "Scalar"], scalars=[None, 0.1, True])]
    rows = build_basis(ops, [Step(index=1), Step(index=2)]).rows
    assert [r["input_shapes"][0] for r in rows] == [x + [3]]


def test_cat_reads_and_writes_its_tensor_list():
    from opscope.analysis.npu.estimate import build_basis
    parts = [[64, 128, 28, 28]] + [[64, 32, 28, 28]] * 8
    op = _op("aten::cat", [parts, []], ["TensorList", "Scalar"], scalars=[None, 1])
    kernel = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]["kernels"][0]
    size = sum(math.prod(p) for p in parts) * 4
    assert kernel["type"] == "ConcatD" and kernel["bytes"] == 2 * size and kernel["written"] == size


def _step_calls(names_shapes, step=2, library=None):
    return [_call(name, [shape], step=step, source="train.py:120") for name, shape in names_shapes]


def test_fused_patterns_are_matched_in_the_op_streams_true_order_not_the_folded_one():
    """A squeeze-excitation block (silu, conv, sigmoid, mul) whose conv signature recurs: folding keeps one
    record per signature, so in first-occurrence order silu sat next to mul and was called an unfused
    SwiGLU; the capture keeps each top-level call's place (OpCall.order) and the match uses it."""
    from opscope.analysis.npu.estimate import cost_model
    from opscope.analysis.npu.kernels import match_fused_patterns
    from opscope.capture.events import compact_calls
    a, b, c = [64, 32, 1, 1], [64, 96, 56, 56], [64, 16, 112, 112]
    shared: dict = {}
    # two blocks' squeeze-excitation tails (the convolutions are views of the stream: they launch below it)
    se = [("aten::sigmoid", a), ("aten::mul", c), ("aten::silu", b), ("aten::sigmoid", a), ("aten::mul", b)]
    calls = compact_calls(_step_calls(se, step=1), shared) + compact_calls(_step_calls(se), shared)
    model = cost_model()
    found = match_fused_patterns(calls, model["fused_patterns"], set(model["views"]))
    assert [p["api"] for p in found] == []
    swiglu = [("aten::silu", b), ("aten::mul", b), ("aten::add", b)]
    calls = compact_calls(_step_calls(swiglu, step=1), {}) + compact_calls(_step_calls(swiglu), {})
    found = match_fused_patterns(calls, model["fused_patterns"], set(model["views"]))
    assert [(p["api"], p["count"], p["sites"]) for p in found] == [("torch_npu.npu_swiglu", 1, [["train.py:120", None]])]


def test_an_unfused_pattern_marks_only_the_rows_at_its_library_line():
    """A framework's model runs from one user line: only the rows the matched calls came from (the same
    library line) get the `unfused` reason, not every mul the model makes from that user line."""
    from opscope.analysis.npu.estimate import _mark_unfused
    rows = [{"name": "aten::mul", "source": "train.py:120", "library": lib, "phase": "forward", "reasons": []}
            for lib in ("timm/layers/mlp.py:40", "torchvision/models/efficientnet.py:160")]
    pattern = {"api": "torch_npu.npu_swiglu", "ops": ["silu", "mul"], "sources": ["train.py:120"],
               "source": "train.py:120", "fix": "", "sites": [["train.py:120", "timm/layers/mlp.py:40"]]}
    _mark_unfused(rows, [pattern])
    assert [bool(r["reasons"]) for r in rows] == [True, False]


def test_a_linear_weight_is_cast_to_fractal_nz_once_on_910a_not_each_call():
    """torch_npu's Module.npu()/.to() casts nn.Linear weights to FRACTAL_NZ when the model moves (cast_weight):
    on a 910A a linear converts its activation in and its result out each call, not its weight; a matmul of
    two activations converts both operands."""
    from opscope.analysis.npu.estimate import build_basis
    x, w = [4096, 1024], [4096, 1024]
    rows = {r["name"]: r for r in build_basis([_op("aten::linear", [x, w, [4096]]), _op("aten::mm", [x, [1024, 512]])],
                                              [Step(index=1), Step(index=2)]).rows}
    assert [k["note"] for k in rows["aten::linear"]["transdata_910a"]] == \
        ["4096x1024 <-> FRACTAL_NZ", "4096x4096 <-> FRACTAL_NZ"]
    assert len(rows["aten::mm"]["transdata_910a"]) == 3


def test_select_backward_zeroes_the_input_size_and_copies_the_gradient_in():
    """ViT's class-token select: its backward writes a zero tensor of the input's size and copies the
    gradient slice in (was priced generic, as an output the size of the gradient)."""
    from opscope.analysis.npu.estimate import build_basis
    grad, full = [64, 768], [64, 197, 768]
    op = _op("aten::select_backward", [grad, [], [], []], ["float", "ScalarList", "Scalar", "Scalar"],
             phase="backward", scalars=[None, full, 1, 0])
    kernels = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]["kernels"]
    assert [(k["type"], k["bytes"]) for k in kernels] == [("MemSet", math.prod(full) * 4),
                                                          ("ViewCopy", 2 * math.prod(grad) * 4)]


def test_unaligned_summary_rows_keep_matmuls_and_attention_apart_and_price_the_penalty():
    """One summary row per line and kind: matmul axes against 256, attention's D and S against 128, each with
    its own fix; its time is what the penalty adds to the cube time (what aligning saves), not the whole."""
    from opscope.analysis.npu.estimate import build_basis, price
    q = [64, 12, 197, 64]
    ops = [_op("aten::mm", [[12608, 768], [768, 3000]]), _op("aten::mm", [[12608, 3000], [3000, 768]]),
           _op("aten::scaled_dot_product_attention", [q, q, q], ["float"] * 3),
           _op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [q, q, q, q, q, [64, 12, 197]],
               ["float"] * 6, phase="backward")]
    rows = [r.to_dict() for r in price(build_basis(ops, [Step(index=1), Step(index=2)]), "910B2").rows
            if r.kind == "pattern" and r.operator.startswith("unaligned")]
    by_name = {r["operator"]: r for r in rows}
    assert set(by_name) == {"unaligned matmuls (K=3000, N=3000)", "unaligned attention calls (D=64, S=197)"}, by_name
    mm = by_name["unaligned matmuls (K=3000, N=3000)"]
    assert "multiples of 256" in mm["reason"] and "pad K and N" in mm["fix"]
    att = by_name["unaligned attention calls (D=64, S=197)"]
    assert "multiples of 128" in att["reason"] and "head dim" in att["fix"]
    members = [r for r in price(build_basis(ops, [Step(index=1), Step(index=2)]), "910B2").operator_rows()
               if r.operator == "aten::mm"]
    assert mm["npu_time_us"] == pytest.approx(sum(r.cube_us for r in members) * (1 - 1 / 1.3), rel=1e-3)


def test_attention_on_a_910a_runs_the_math_path_not_the_a2_only_fused_kernel():
    """npu_fusion_attention (FlashAttentionScore) is Atlas A2 only (op-plugin's doc): on a 910A SDPA is priced
    as ATen's math path: q @ k^T, softmax, probs @ v, each product converting to FRACTAL_NZ; its gradient
    as four products and the softmax gradient."""
    from opscope.analysis.npu.estimate import build_basis, price
    q = [64, 12, 197, 64]
    ops = [_op("aten::scaled_dot_product_attention", [q, q, q], ["float"] * 3),
           _op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [q, q, q, q, q, [64, 12, 197]],
               ["float"] * 6, phase="backward")]
    basis = build_basis(ops, [Step(index=1), Step(index=2)])
    b2 = {r.operator: r.to_dict() for r in price(basis, "910B2").operator_rows()}
    a = {r.operator: r.to_dict() for r in price(basis, "910A").operator_rows()}
    fwd, bwd = "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
    assert b2[fwd]["kernels"] == "FlashAttentionScore" and "no-fused-kernel" not in b2[fwd]["reason_kinds"]
    assert a[fwd]["kernels"] == "BatchMatMulV2, SoftmaxV2" and a[bwd]["kernels"] == "BatchMatMulV2, SoftmaxGrad"
    assert "Atlas A2 and later only" in a[fwd]["reason"] and a[fwd]["transdata_us"] > 0
    # the fused kernel's alignment rule (D, S multiples of 128) is not the math path's
    assert "unaligned attention" in b2[fwd]["reason"] and "unaligned attention" not in a[fwd]["reason"]
    kernels = next(r for r in basis.rows if r["name"] == fwd)["alternative"]["kernels"]
    heads, s, d = 64 * 12, 197, 64
    assert [k["flops"] for k in kernels if k["type"] == "BatchMatMulV2"] == [2.0 * heads * s * d * s] * 2
    assert sum(1 for k in kernels if k["type"] == "TransData") == 6


def test_batch_norm_takes_nchw_as_it_is_on_910b():
    """CANN's BN kernels accept NCHW (bn_training_reduce/update: NC1HWC0 or NCHW), so a batch norm converts
    nothing; it had been priced by the pooling rule, converting its input only (a tensor left in 5HD)."""
    from opscope.analysis.npu.estimate import build_basis, price
    x = [64, 256, 56, 56]
    forward = _op("aten::native_batch_norm", [x, [256], [256], [256], [256], [], [], []],
                  ["float"] * 5 + ["Scalar"] * 3)
    backward = _op("aten::native_batch_norm_backward", [x, x, [256], [256], [256], [256], [256], [], [], []],
                   ["float"] * 7 + ["Scalar", "Scalar", "ScalarList"], phase="backward")
    basis = build_basis([forward, backward], [Step(index=1), Step(index=2)])
    assert all(r["transdata"] == [] for r in basis.rows)
    assert price(basis, "910B2").step.transdata_kernels == 0


def test_a_linear_backward_reads_the_weight_already_in_fractal_nz_on_910a():
    """The grad-input product of a linear's backward (grad @ W) reads the same cast-once weight: its shape is
    a parameter's (from the optimizer's updates), so only the gradient and the result convert."""
    from opscope.analysis.npu.estimate import build_basis
    w, grad = [4096, 1024], [512, 4096]
    ops = [_op("aten::mm", [grad, w], phase="backward"),
           _op("aten::add_", [w, w], phase="optimizer", calls=1)]
    row = next(r for r in build_basis(ops, [Step(index=1), Step(index=2)]).rows if r["name"] == "aten::mm")
    assert [k["note"] for k in row["transdata_910a"]] == ["512x4096 <-> FRACTAL_NZ", "512x1024 <-> FRACTAL_NZ"]


def test_a_signature_is_free_only_when_none_of_its_calls_launches():
    """An operator keeps its first call's arguments: a sanity-check validation's dropout(train=False) first must
    not make the training calls of the same signature free (the call stream says which calls launch)."""
    from opscope.analysis.npu.estimate import build_basis
    x = [64, 197, 768]
    op = _op("aten::dropout", [x, [], []], ["float", "Scalar", "Scalar"], scalars=[None, 0.1, False], calls=13)
    calls = [_call("aten::dropout", [x, [], []], step=2, count=1), _call("aten::dropout", [x, [], []], step=2, count=12)]
    calls[0].dtypes = calls[1].dtypes = ["float", "Scalar", "Scalar"]
    calls[0].scalars, calls[1].scalars = [None, 0.1, False], [None, 0.1, True]
    rows = build_basis([op], [Step(index=1), Step(index=2)], calls).rows
    assert len(rows) == 1 and rows[0]["calls_per_step"] == 13
    calls[1].scalars = [None, 0.0, True]   # every call a no-op: no row
    assert build_basis([op], [Step(index=1), Step(index=2)], calls).rows == []


def test_new_zeros_writes_its_size_argument():
    from opscope.analysis.npu.estimate import build_basis
    op = _op("aten::new_zeros", [[1], [], [], [], [], []], ["float"] + ["ScalarList"] + [""] * 4,
             scalars=[None, [4096, 4096], None, None, None, None])
    kernel = build_basis([op], [Step(index=1), Step(index=2)]).rows[0]["kernels"][0]
    assert (kernel["type"], kernel["bytes"]) == ("ZerosLike", 4096 * 4096 * 4)


def test_l2_is_not_credited_twice_nor_to_a_kernel_whose_writes_are_unknown():
    from opscope.analysis.npu.cost import Kernel, kernel_time_us, resolve_chip
    _, b2 = resolve_chip("910B2")
    relu = Kernel("Relu", "vector", bytes=100e6, written=50e6)   # its fitted rate was reached in L2 already
    assert kernel_time_us(Kernel("Relu", "vector", bytes=100e6, written=50e6, warm=1.0), b2) == \
        kernel_time_us(relu, b2)
    unknown = Kernel("Add", "vector", bytes=100e6)   # no written bytes: the read/write split is unknown
    assert kernel_time_us(Kernel("Add", "vector", bytes=100e6, warm=1.0), b2) == kernel_time_us(unknown, b2)


def test_a_weight_gradient_product_converts_its_activation_even_when_shaped_like_a_weight():
    """Linear(784 -> 256) at batch 256: the weight-gradient product grad^T @ x yields the weight's shape, so its
    [256, 784] operand x is an activation, not the cast-once weight."""
    from opscope.analysis.npu.estimate import build_basis
    ops = [_op("aten::mm", [[256, 256], [256, 784]], phase="backward"),
           _op("aten::add_", [[256, 784], [256, 784]], phase="optimizer")]
    row = next(r for r in build_basis(ops, [Step(index=1), Step(index=2)]).rows if r["name"] == "aten::mm")
    assert len(row["transdata_910a"]) == 3


def test_the_estimate_is_a_typed_section_that_round_trips_through_scan_json(tmp_path):
    """``ScanResult.npu_estimate`` is an ``NpuEstimate`` read through the checked builder: written and read back it
    is the same JSON, key for key (rows of both kinds keep their own keys), and a bad value is a one-line input
    error naming its JSON path."""
    from opscope.analysis.npu.estimate import build_basis, price
    from opscope.errors import InputError
    from opscope.model import EstimateRow, EstimateWorld, NpuEstimate, ScanResult
    from opscope.schema import load_scan as load_result
    est = price(build_basis(_alexnet_operators(batch=8), [Step(index=1), Step(index=2)]), "910B2")
    assert isinstance(est, NpuEstimate) and all(isinstance(r, EstimateRow) for r in est.rows)
    assert isinstance(est.step.world(8), EstimateWorld) and est.step.world(3) is None
    assert {r.kind for r in est.rows} == {"operator", "pattern"}
    doc = ScanResult(npu_estimate=est).to_dict()["npu_estimate"]
    assert list(doc) == ["chip", "family", "rows", "step", "patterns", "batch", "gradients", "calibration", "factors",
                         "basis", "label"]
    pattern = next(r for r in doc["rows"] if r["kind"] == "pattern")
    assert "priced_by" not in pattern and pattern["input_shapes"] is None   # a pattern row writes only its keys
    back = ScanResult(npu_estimate=json.loads(json.dumps(doc))).npu_estimate
    assert back is not None and json.dumps(back.to_dict()) == json.dumps(doc)
    assert back.step.per_world_size[0].bound == est.step.per_world_size[0].bound
    scan = ScanResult(npu_estimate=est).to_dict()
    scan["npu_estimate"]["step"]["per_world_size"][1]["step_us"] = "slow"
    (tmp_path / "scan.json").write_text(json.dumps(scan))
    with pytest.raises(InputError) as bad:
        load_result(tmp_path)
    assert "$.npu_estimate.step.per_world_size[1].step_us" in str(bad.value)
