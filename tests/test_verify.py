"""opscope verify, operator pass: valid inputs, msprobe standards, a planted numeric bug, the CLI."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import EXAMPLES, ROOT as REPO, load_scan, run_opscope
from opscope.analysis.verify import judge_outputs, judge_tensor, prediction_disagreement, summarise
from opscope.model import Operator, ScanResult
from opscope.replay import run as replay_run
from opscope.replay.inputs import (DumpedTensors, NotReplayable, SyntheticTensors, build_call, load_standards,
                                   signature_key)
from opscope.replay.run import verify_operators, verify_signature

STANDARDS = load_standards()
CPU = torch.device("cpu")


def op(name, overload, shapes, dtypes, scalars, verdict="native"):
    return Operator(name=name, overload=overload, input_shapes=shapes, dtypes=dtypes, scalars=scalars,
                    verdict=verdict)


# ------------------------------------------------------------------ valid inputs

def test_index_arguments_are_in_range_for_the_op():
    nll = build_call(op("aten::nll_loss_forward", "", [[32, 10], [32], [], [], []],
                        ["float", "long int", "", "Scalar", "Scalar"], [None, None, None, 1, -100]))
    target = nll.args[1]
    assert target.dtype == torch.int64 and int(target.min()) >= 0 and int(target.max()) < 10
    emb = build_call(op("aten::embedding", "", [[50, 8], [4, 7], [], [], []],
                        ["float", "long int", "Scalar", "Scalar", "Scalar"], [None, None, -1, False, False]))
    assert int(emb.args[1].max()) < 50
    pool = build_call(op("aten::max_pool2d_with_indices_backward", "",
                         [[2, 3, 4, 4], [2, 3, 8, 8], [], [], [], [], [], [2, 3, 4, 4]],
                         ["float", "float", "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar",
                          "long int"], [None, None, [2, 2], [2, 2], [0, 0], [1, 1], False, None]))
    assert int(pool.args[7].max()) < 64 and int(pool.args[7].min()) >= 0


def test_variances_are_positive_and_unresolved_overloads_are_resolved():
    bn = build_call(op("aten::native_batch_norm", "", [[4, 3, 5, 5], [3], [3], [3], [3], [], [], []],
                       ["float", "float", "float", "float", "float", "Scalar", "Scalar", "Scalar"],
                       [None, None, None, None, None, False, 0.1, 1e-5]))
    assert float(bn.args[4].min()) > 0  # running_var
    to_copy = build_call(op("aten::sum", None, [[3, 4], [], [], []], ["float", "ScalarList", "Scalar", ""],
                            [None, [0], True, None]))
    assert to_copy.schema.overload_name == "dim_IntList"


@pytest.mark.parametrize("name,dtypes,scalars,why", [
    ("aten::dropout", ["float", "Scalar", "Scalar"], [None, 0.5, True], "random"),
    ("aten::empty_like", ["float", "", "", "", "Scalar", "Scalar"], [None, None, None, None, False, 1], "no numeric"),
    ("aten::view", ["float", "ScalarList"], [None, [12]], "alias"),
    ("c10d::allreduce_", ["TensorList", "Scalar"], [None, None], "communication"),
])
def test_ops_without_a_meaningful_replay_are_skipped_with_a_reason(name, dtypes, scalars, why):
    shapes = [[3, 4]] + [[] for _ in dtypes[1:]]
    result = verify_signature(op(name, None, shapes, dtypes, scalars), CPU)
    assert result.outcome == "skipped" and why in result.message


def test_dumped_tensors_are_replayed_when_the_scan_saved_them(tmp_path):
    sig = op("aten::relu", "", [[2, 3]], ["float"], [None])
    key = signature_key(sig.name, sig.overload, sig.input_shapes, sig.dtypes)
    (tmp_path / "inputs").mkdir()
    real = torch.tensor([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]])
    torch.save({0: real}, tmp_path / "inputs" / f"{key}.pt")
    source = DumpedTensors(tmp_path, SyntheticTensors(0))
    call = build_call(sig, source=source)
    assert torch.equal(call.args[0], real) and source.used == 1
    result = verify_operators([sig], "cpu", run_dir=tmp_path)
    assert result["inputs"] == "dumped" and result["results"][0]["outcome"] == "measured"


# ------------------------------------------------------------------ standards

def test_integer_outputs_need_an_exact_match():
    ref = torch.arange(10)
    bad = ref.clone()
    bad[3] += 1
    assert judge_tensor("argmax", ref.clone(), ref, None, STANDARDS)["outcome"] == "pass"
    judged = judge_tensor("argmax", bad, ref, None, STANDARDS)
    assert judged["outcome"] == "fail" and judged["standard"] == "binary" and "1 of 10" in judged["message"]


def test_elementwise_fp16_goes_to_the_benchmark_standard_like_msprobe_26():
    """msprobe 26.2.0 judges every float output by the benchmark standard (mul included): the
    device may be no worse than the CPU low-precision result by the L0 ratios."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(1000, generator=gen).half(), torch.randn(1000, generator=gen).half()
    oracle = a.double() * b.double()
    ref = a * b
    ok = judge_tensor("mul", ref.clone(), ref, oracle, STANDARDS)
    assert ok["outcome"] == "pass" and ok["standard"] == "benchmark" and ok["metrics"]["level"] == "L0"
    off = ref.clone()
    off[10] = off[10] * 1.01  # 1 % off on one element: max rel err ~20x the CPU's (L0 limit 10)
    judged = judge_tensor("mul", off, ref, oracle, STANDARDS)
    assert judged["outcome"] == "fail" and judged["standard"] == "benchmark" and "max_rel_err" in judged["message"]
    slight = ref.clone()
    slight[10] = (slight[10].double() * (1 + 2 ** -10)).half()  # one ulp on one element: within L0
    assert judge_tensor("mul", slight, ref, oracle, STANDARDS)["outcome"] == "pass"


def test_min_err_floors_the_ratio_denominator_as_msprobe_does():
    """fp32: a reference error of ~1e-8 is floored at 2**-14, so a device error of 1e-5 passes
    (ratio ~0.16), where a 2-ulp floor would have failed it by a factor of ~100."""
    x = torch.linspace(1, 2, 1000, dtype=torch.float64)
    ref = x.float()
    dev = (x * (1 + 1e-5)).float()
    judged = judge_tensor("exp", dev, ref, x, STANDARDS)
    assert judged["outcome"] == "pass", judged
    assert judged["metrics"]["ratios"]["max_rel_err"] < 1


def test_api_levels_tighten_the_benchmark_for_mm_and_sum():
    from opscope.analysis.verify import api_level, benchmark_thresholds
    assert api_level("mm", STANDARDS) == "L2" and api_level("embedding", STANDARDS) == "L1"
    assert api_level("convolution", STANDARDS) == "L0"
    assert benchmark_thresholds("sum", STANDARDS) == {"small_value_err": 2.0, "max_rel_err": 2.0,
                                                      "mean_rel_err": 1.2, "rmse": 1.2}
    # a 3x worse max relative error fails an L2 op and passes an L0 one
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=gen).bfloat16()
    oracle = x.double() * 3
    ref = (x * 3).bfloat16()
    err = (oracle - ref.double()).abs() / oracle.abs()
    worst = int(err.argmax())
    dev = ref.clone()
    dev[worst] = (oracle[worst] * (1 + 3 * float(err[worst]))).bfloat16()
    mm, other = judge_tensor("mm", dev, ref, oracle, STANDARDS), judge_tensor("mul", dev, ref, oracle, STANDARDS)
    r = mm["metrics"]["ratios"]["max_rel_err"]
    assert 2 < r < 10, r
    assert mm["outcome"] == "fail" and other["outcome"] == "pass"


def test_matmul_judged_relative_to_the_cpu_low_precision_error():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(64, 256, generator=gen).bfloat16(), torch.randn(256, 32, generator=gen).bfloat16()
    oracle, ref = a.double() @ b.double(), a @ b
    ok = judge_tensor("mm", ref.clone(), ref, oracle, STANDARDS)
    assert ok["outcome"] == "pass" and ok["standard"] == "benchmark"
    assert ok["metrics"]["cosine"] > 0.999 and 0 < ok["metrics"]["ratio_rel_err_lt_0_005"] <= 1
    worse = (ref.float() * (1 + 0.05 * torch.randn(ref.shape, generator=gen))).bfloat16()
    judged = judge_tensor("mm", worse, ref, oracle, STANDARDS)
    assert judged["outcome"] == "fail" and "max_rel_err" in judged["message"]


def test_index_ties_warn_instead_of_failing():
    values = torch.tensor([[1.0, 1.0, 0.5]])
    ref = [values.max(dim=1).values, torch.tensor([0])]
    dev = [ref[0].clone(), torch.tensor([1])]  # the other one of two equal maxima
    judged = judge_outputs("max", dev, ref, [ref[0].double(), ref[1]], STANDARDS)
    assert judged["outcome"] == "warn" and "ties" in judged["message"]


def test_disagreement_with_the_scan_verdict_only_for_the_npu():
    assert prediction_disagreement("error", "native", "npu") == "predicted native, but the op raised on the NPU"
    assert prediction_disagreement("pass", "unsupported", "npu").startswith("predicted unsupported")
    assert prediction_disagreement("fail", "native", "npu") is None       # accuracy, not support
    assert prediction_disagreement("error", "native", "cpu") is None      # verdicts target torch_npu
    assert summarise([{"outcome": "pass"}, {"outcome": "error", "disagreement": "x"}])["disagreements"] == 1


def test_the_standards_cite_their_sources():
    import re
    assert STANDARDS["msprobe"] == {"package": "mindstudio-probe", "version": "26.2.0",
                                    "root": "msprobe/pytorch/api_accuracy_checker"}
    bench = STANDARDS["standards"]["benchmark"]
    cited = [STANDARDS["dtypes"], STANDARDS["outcomes"], STANDARDS["selection"], bench, bench["levels"],
             bench["level_apis"], bench["small_value_err_ratio"], STANDARDS["standards"]["binary"]]
    for block in cited:  # file and line of msprobe
        assert re.search(r"[a-z_/]+\.py:\d+", block["source"]), block["source"]
    for block in (STANDARDS["accuracy_reached"], STANDARDS["index_outputs"]):
        assert "msprobe" in block["source"] or "hiascend" in block["source"]


def _msprobe():
    try:
        from msprobe.core.common.const import CompareConst
        from msprobe.pytorch.api_accuracy_checker.precision_standard import standard_config
    except Exception as exc:  # not installed (or its dependencies are not)
        pytest.skip(f"mindstudio-probe is not importable: {type(exc).__name__}: {exc}")
    return standard_config, CompareConst


def test_thresholds_equal_installed_msprobe():
    """Every threshold in verify_standards.yaml against the installed mindstudio-probe's StandardConfig,
    and every cited line of standard_config.py holds the named symbol."""
    import inspect
    from importlib.metadata import version
    standard_config, CompareConst = _msprobe()
    SC = standard_config.StandardConfig
    assert version("mindstudio-probe") == STANDARDS["msprobe"]["version"]
    table = STANDARDS["dtypes"]
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32),
                        ("default", None)):
        key = dtype if dtype is not None else "default"
        row = table[name]
        assert row["small_value"] == SC._small_value[key], name
        assert row["small_value_atol"] == SC._benchmark_small_value_atol[key], name
        assert row["threshold_small_value_atol"] == SC._threshold_small_value_atol[key], name
        assert row["rtol"] == SC._rtol[key], name
        assert row["min_err"] == SC.get_minmum_err(str(dtype) if dtype is not None else "default"), name
        if dtype is not None:  # the public accessors agree too
            assert row["small_value"] == SC.get_small_value(dtype, CompareConst.BENCHMARK)
            assert row["small_value_atol"] == SC.get_small_value_atol(dtype, CompareConst.BENCHMARK)
    bench = STANDARDS["standards"]["benchmark"]
    for level, limits in ((k, v) for k, v in bench["levels"].items() if k != "source"):
        assert limits == {"max_rel_err": SC.get_benchmark_ratio_threshold(CompareConst.MAX_REL_ERR, level=level),
                          "mean_rel_err": SC.get_benchmark_ratio_threshold(CompareConst.MEAN_REL_ERR, level=level),
                          "rmse": SC.get_benchmark_ratio_threshold(CompareConst.RMSE, level=level)}, level
    assert bench["small_value_err_ratio"]["threshold"] == SC.get_benchmark_threshold("small_value")
    assert set(bench["level_apis"]["L1"]) == SC.L1_API_LIST and set(bench["level_apis"]["L2"]) == SC.L2_API_LIST
    from opscope.analysis.verify import api_level
    for api in ("mm", "sum", "embedding", "scatter_add_", "convolution", "add"):
        assert api_level(api, STANDARDS) == SC.get_api_level(api)
    # float outputs -> benchmark, int/bool -> binary, as msprobe selects
    from msprobe.pytorch.api_accuracy_checker.precision_standard.standard_register import StandardRegistry
    reg = StandardRegistry()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert reg._get_standard_category("add", dtype, dtype) == CompareConst.BENCHMARK
    assert reg._get_standard_category("argmax", "torch.int64", torch.float32) == CompareConst.BINARY_CONSISTENCY
    # the standards no float output reaches, complete too
    ulp = STANDARDS["standards"]["ulp"]
    assert SC.get_ulp_threshold(torch.float32) == (ulp["float32"]["mean_ulp_err"], ulp["float32"]["ulp_err_proportion"],
                                                   ulp["float32"]["proportion_ratio"])
    assert SC.get_ulp_threshold(torch.float16) == (None, ulp["float16"]["ulp_err_proportion"],
                                                   ulp["float16"]["proportion_ratio"])
    thousandth = STANDARDS["standards"]["thousandth"]
    assert (thousandth["rel_err"], thousandth["pass_share"]) == (CompareConst.THOUSAND_RATIO_THRESHOLD,
                                                                 CompareConst.THOUSANDTH_PASS_VALUE)
    # the cited lines are where those symbols are
    lines = inspect.getsource(standard_config).splitlines()
    for symbol, first in (("L1_API_LIST", 57), ("L2_API_LIST", 61), ("_small_value =", 66),
                          ("_threshold_small_value_atol", 72), ("_benchmark_small_value_atol", 78), ("_rtol =", 84),
                          ("_small_value_threshold", 96), ("_minmum_err", 121)):
        assert symbol in lines[first - 1], (symbol, first, lines[first - 1])


# ------------------------------------------------------------------ real scans

@pytest.fixture()
def cnn_run(cnn_scan, tmp_path):
    """A private copy of the shared CNN scan (verify rewrites scan.json)."""
    target = tmp_path / "run"
    shutil.copytree(cnn_scan, target)
    return target


def _operators(run_dir):
    return ScanResult.from_dict(load_scan(run_dir)).operators


def test_planted_numeric_bug_is_caught_as_fail(cnn_run, monkeypatch):
    real = replay_run.run_on_device

    def buggy(call, device):  # a device whose addmm is slightly wrong (computed on the CPU)
        outputs = real(call, torch.device("cpu"))
        if call.name == "aten::addmm":
            outputs = [o * 1.02 for o in outputs]
        return outputs

    monkeypatch.setattr(replay_run, "run_on_device", buggy)
    # a device that is not the CPU (on the CPU itself nothing is judged): "meta" stands for it
    monkeypatch.setattr(replay_run, "resolve_device", lambda name: torch.device("meta"))
    verification = verify_operators(_operators(cnn_run), "npu", only=["addmm", "aten::mm", "relu"])
    by_op = {}
    for row in verification["results"]:
        by_op.setdefault(row["op"], set()).add(row["outcome"])
    assert by_op["aten::addmm"] == {"fail"}
    # named as msprobe names them: error for fail, pass for pass
    assert {r["msprobe"] for r in verification["results"] if r["op"] == "aten::addmm"} == {"error"}
    assert {r["msprobe"] for r in verification["results"] if r["op"] == "aten::mm"} == {"pass"}
    assert by_op["aten::mm"] == {"pass"} and by_op["aten::relu"] == {"pass"}


def test_verify_cli_on_a_real_cnn_scan(cnn_run):
    """--device cpu: the device run would be the reference run, so nothing is reported as a pass;
    floating-point signatures are measured against float64 as the CPU's own numerics."""
    before = load_scan(cnn_run)
    proc = run_opscope("verify", cnn_run, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Operator verification on cpu" in proc.stderr and "not NPU evidence" in proc.stderr
    after = load_scan(cnn_run)
    verification = after.pop("verification")
    before.pop("verification")
    assert after == before  # everything else preserved
    counts = verification["counts"]
    assert counts["pass"] == counts["warn"] == counts["fail"] == counts["error"] == 0  # never a self-comparison pass
    assert counts["measured"] >= 50
    assert counts["total"] == len(before["operators"])
    assert verification["reference"].startswith("none: on the CPU")
    conv = [r for r in verification["results"] if r["op"] == "aten::convolution_backward"]
    assert conv and all(r["outcome"] == "measured" and r["standard"] == "cpu-numerics" for r in conv)
    for r in verification["results"]:
        assert r["outcome"] in ("measured", "skipped")
        assert r["message"]
        if r["outcome"] == "measured":
            assert "not NPU evidence" in r["message"] and r["metrics"]["dtype"]
            assert set(r["metrics"]) >= {"cosine", "max_abs_err", "max_rel_err", "ratio_rel_err_lt_0_001",
                                         "ratio_rel_err_lt_0_005", "low_precision"}
        else:
            assert "same CPU computation" in r["message"] or "skipped" not in r["message"]
    # the CNN example runs under autocast: its low-precision kernels are among the measured ones
    assert any(r["metrics"].get("low_precision") for r in verification["results"] if r["outcome"] == "measured")
    ScanResult.from_dict(load_scan(cnn_run))  # still a valid scan.json


def test_huber_substitute_is_verified_equivalent_and_a_wrong_one_fails(tmp_path):
    """Scan the HuberLoss example, verify on the CPU: the suggested smooth_l1_loss substitute is
    replayed against huber_loss on the captured shapes (forward and backward) and passes; a
    planted wrong substitute fails."""
    import yaml
    from opscope.replay.substitutes import verify_substitutes
    run = tmp_path / "huber"
    proc = run_opscope("scan", EXAMPLES / "train_huber.py", "--steps", "2", "--out", run, "--format", "json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = run_opscope("verify", run, "--device", "cpu", "--only", "huber")
    assert proc.returncode == 0, proc.stderr[-3000:]
    verification = load_scan(run)["verification"]
    subs = [r for r in verification["substitutes"] if r["op"] == "aten::huber_loss"]
    assert subs and all(r["outcome"] == "pass" for r in subs), subs
    row = subs[0]
    assert row["message"].startswith("verified equivalent on your shapes") and "max rel err" in row["message"]
    assert row["forward"]["standard"] == "benchmark" and row["backward"]["standard"] == "benchmark"
    assert row["msprobe"] == "pass"
    assert row["input_shapes"][0] == [64, 1]  # the captured shapes, not made-up ones
    assert "verified equivalent" in proc.stderr
    assert verification["counts"]["pass"] == 0  # the op rows themselves are only measured on the CPU
    # a planted wrong substitute: smooth_l1 with the wrong beta is not Huber(delta)
    data = yaml.safe_load((REPO / "support_matrix" / "substitutes.yaml").read_text())
    option = data["substitutes"]["aten::huber_loss"][0]
    option["check"] = dict(option["check"], substitute="torch.ops.aten.smooth_l1_loss(self, target, reduction, 2 * delta)")
    ops = [op for op in _operators(run) if op.name == "aten::huber_loss"]
    wrong = verify_substitutes(ops, torch.device("cpu"), substitutes=data)
    assert wrong and all(r["outcome"] == "fail" for r in wrong), wrong
    assert wrong[0]["message"].startswith("NOT equivalent")


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_unavailable_device_is_a_one_line_error(cnn_run, device):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = run_opscope("verify", cnn_run, "--device", device, "--only", "relu")
    assert proc.returncode == 2 and proc.stderr.startswith(f"opscope: error: --device {device}")
    assert "Traceback" not in proc.stderr


def test_bad_invocations_are_one_line_errors(tmp_path):
    proc = run_opscope("verify", "--device", "cpu")
    assert proc.returncode == 2 and "RUN_DIR" in proc.stderr
    proc = run_opscope("verify", tmp_path, "--device", "cpu")
    assert proc.returncode == 2 and "scan.json" in proc.stderr and "Traceback" not in proc.stderr


def test_out_variants_string_defaults_and_masks_from_a_real_scan_replay():
    huber_bwd = op("aten::huber_loss_backward", None, [[8, 1], [8, 1], [8, 1], [], [], [8, 1]],
                   ["float", "float", "float", "Scalar", "Scalar", "float"], [None, None, None, 1, 1.0, None])
    gelu = op("aten::gelu", None, [[4, 5], []], ["float", ""], [None, None])  # str `approximate` recorded as None
    scatter = op("aten::masked_scatter_", "", [[6, 7], [6, 7], [10]], ["float", "bool", "float"],
                 [None, None, None])
    for sig in (huber_bwd, gelu, scatter):
        result = verify_signature(sig, CPU)
        assert result.outcome == "measured", (sig.name, result.message)  # replayed; on the CPU only measured
    call = build_call(scatter)
    assert int(call.args[1].sum()) == 10  # exactly as many selected places as source elements


def test_verify_rerenders_the_reports_and_says_why_signatures_were_skipped(cnn_run):
    assert run_opscope("report", cnn_run, "--format", "html,xlsx", "-q").returncode == 0
    assert "Verification" not in (cnn_run / "report.html").read_text()
    proc = run_opscope("verify", cnn_run, "--device", "cpu", "--only", "relu", "--only", "_to_copy", "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (cnn_run / "report.html").read_text()
    assert 'id="verification"' in html  # the report next to scan.json is not stale
    import openpyxl
    assert "Verification" in openpyxl.load_workbook(cnn_run / "report.xlsx").sheetnames
    assert "re-rendered" in proc.stderr and "report.html" in proc.stderr
    skipped = load_scan(cnn_run)["verification"]["counts"]["skipped"]
    if skipped:  # every skip is counted under a reason, in the terminal and in the report
        line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("skipped "))
        assert line.startswith(f"skipped {skipped} of ")
        assert "Skipped, by reason" in html


def test_skip_reasons_are_counted_per_reason():
    from opscope.report.verification_view import skip_reasons
    results = [{"outcome": "skipped", "message": "argument weight was not recorded and has no default"},
               {"outcome": "skipped", "message": "argument bias was not recorded and has no default"},
               {"outcome": "skipped", "message": "host-only op in this script (set-up or data loading on CPU tensors)"},
               {"outcome": "skipped", "message": "aten::foo.bar: no such overload in this torch"},
               {"outcome": "pass", "message": ""}]
    assert skip_reasons({"results": results}) == [
        ("an argument was not recorded and has no default", 2), ("host-only op in this script", 1),
        ("no such overload in this torch", 1)]
