"""`opscope diff RUN NPU_PROFILE`'s estimate comparison: priced at the profile's own world size and
chip (also when one rank folder of a multi-rank export is given), for any world size, with the
calibration line saying what the figures were fitted on; and the accuracy bench's leave-one-out refit."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from opscope.analysis.npu.compare import chip_and_source, compare, world_size
from opscope.analysis.npu.cost import FITTED_PROFILES, Kernel, calibration_factors, cost_model, fitted_on
from opscope.analysis.npu.estimate import price
from opscope.model import EstimateBasis

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ALEX = SHARED / "data/ascend_profiles/alexnet_ddp_2rank/text/level1"
LLM = SHARED / "data/ascend_profiles/llm_megatron_4rank_level2"
needs_shared = pytest.mark.skipif(not ALEX.is_dir() or not LLM.is_dir(), reason="../shared/data/ascend_profiles absent")

KERNEL_HEADER = ("Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim,"
                 "Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats\n")
STEP_HEADER = ("Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
               "Communication(Not Overlapped and Exclude Receive),Preparing\n")


def _export(root: Path, ranks: int, group: int | None = None, cores: int = 24, transit_ms: float | None = None) -> Path:
    """A text export of ``ranks`` rank folders (kernels, steps, profiler_info); ``group``: the HCCL group its
    all-reduce spans (communication_matrix.json), which may be larger than the ranks exported."""
    for r in range(ranks):
        pt = root / f"rank{r}_ascend_pt"
        out = pt / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (pt / f"profiler_info_{r}.json").write_text(json.dumps({"rank_id": r}))
        (out / "kernel_details.csv").write_text(
            KERNEL_HEADER + f'5,conv,Conv2D,AI_CORE,0,900,0,{cores},"32,3,224,224;64,3,11,11",FLOAT;FLOAT,'
            'NCHW;NCHW,"32,64,55,55",FLOAT,NCHW\n'
            "5,add,Add,AI_VECTOR_CORE,0,20,0,48,\"1024\",FLOAT,ND,\"1024\",FLOAT,ND\n")
        (out / "step_trace_time.csv").write_text(STEP_HEADER + "5,9000,100000,4000,104000,25000,136000,0,100000,18000\n")
        if group:
            links = {f"{r}-{p}": {"Transport Type": "LOCAL" if p == r else "HCCS", "Transit Size(MB)": 61.2}
                     for p in range(group)}
            (out / "communication_matrix.json").write_text(json.dumps(
                {"step5": {"p2p": {}, "collective": {"allreduce-total@1": links}}}))
        if transit_ms is not None:
            (out / "communication.json").write_text(json.dumps({"step5": {"collective": {"Total Op Info": {
                "Communication Time Info": {"Elapse Time(ms)": 100.0, "Transit Time(ms)": transit_ms}}}}}))
    return root


def _basis(grad_bytes: float = 244e6) -> EstimateBasis:
    """A scan's estimate basis: one convolution backward (hides part of the all-reduce) and DDP's gradients."""
    conv = {"type": "Conv2DBackpropInput", "unit": "cube", "flops": 2e11, "bytes": 5e7, "dtype": "float32"}
    return EstimateBasis.from_dict({"rows": [{"name": "aten::convolution_backward", "phase": "backward",
                                              "calls_per_step": 1.0, "kernels": [conv], "launches_per_step": 1.0}],
                                    "gradients": {"bytes": grad_bytes, "parameters": 16}, "batch": {"value": 32}})


def _step(cmp: dict, item: str) -> dict:
    return next(r for r in cmp["steps"] if r["item"] == item)


def test_one_rank_folder_of_a_two_rank_export_is_compared_at_two_devices(tmp_path):
    export = _export(tmp_path / "job", ranks=2)
    est = price(_basis(), "Ascend910B2")   # the scan's estimate: 1, 8 and 16 devices
    cmp = compare(est, export / "rank0_ascend_pt")
    two = price(_basis(), "Ascend910B2", world_sizes=[2]).step.per_world_size[0]
    assert cmp["devices"] == 2 and "2 rank folder(s)" in cmp["devices_source"]
    assert _step(cmp, "step")["estimated_us"] == pytest.approx(two.step_us, abs=0.1)
    assert _step(cmp, "communication (not overlapped)")["estimated_us"] == pytest.approx(
        two.exposed_communication_us, abs=0.1) and two.exposed_communication_us > 0
    # the same from the ASCEND_PROFILER_OUTPUT folder, a kernel_details.csv, or the folder of ranks
    for path in (export / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT",
                 export / "rank1_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", export):
        assert world_size(path)[0] == 2


def test_the_hccl_group_gives_the_world_size_when_only_some_ranks_were_exported(tmp_path):
    """The shared AlexNet export holds 2 rank folders of an 8-rank all-reduce: its links go to 8 ranks."""
    export = _export(tmp_path / "job", ranks=2, group=8)
    world, source = world_size(export / "rank0_ascend_pt")
    assert world == 8 and "HCCL group of 8 ranks" in source and "6 rank(s) were not exported" in source
    est = price(_basis(), "Ascend910B2", world_sizes=[1])
    cmp = compare(est, export)
    eight = price(_basis(), "Ascend910B2", world_sizes=[8]).step.per_world_size[0]
    assert cmp["devices"] == 8 and _step(cmp, "step")["estimated_us"] == pytest.approx(eight.step_us, abs=0.1)
    # --devices wins over the profile
    assert compare(est, export, devices=2)["devices"] == 2


@pytest.mark.parametrize("world", [3, 5, 6, 12])
def test_any_world_size_is_priced_with_the_estimates_calibration_factors(tmp_path, world):
    export = _export(tmp_path / "job", ranks=1, group=world)
    factors = {"cube": 2.0, "vector": 1.5}
    est = price(_basis(), "Ascend910B2", factors)
    cmp = compare(est, export)
    want = price(_basis(), "Ascend910B2", factors, world_sizes=[world]).step.per_world_size[0]
    assert cmp["devices"] == world
    assert _step(cmp, "computing")["estimated_us"] == pytest.approx(want.device_us, abs=0.1)
    assert _step(cmp, "step")["estimated_us"] == pytest.approx(want.step_us, abs=0.1)


def test_transfers_are_compared_without_the_waits_and_a_single_device_job_has_no_communication(tmp_path):
    export = _export(tmp_path / "job", ranks=2, transit_ms=3.7)
    cmp = compare(price(_basis(), "Ascend910B2"), export)
    row = _step(cmp, "communication transfers (HCCL transit, incl. overlapped)")
    assert row["measured_us"] == pytest.approx(3700.0) and row["estimated_us"] > 0
    single = _export(tmp_path / "one", ranks=1)
    cmp = compare(price(_basis(), "Ascend910B2"), single)
    assert cmp["devices"] == 1 and _step(cmp, "communication (not overlapped)")["estimated_us"] == 0


def test_the_chip_comes_from_the_profiles_ai_cores(tmp_path):
    assert chip_and_source(_export(tmp_path / "a", ranks=1, cores=20))[0] == "Ascend910B3"
    chip, why = chip_and_source(_export(tmp_path / "b", ranks=1, cores=24))
    assert chip == "Ascend910B2" and "24 AI cores" in why and "Ascend910B1" in why   # same core count: said
    assert chip_and_source(_export(tmp_path / "c", ranks=1, cores=7))[0] is None


def test_calibration_lines_state_what_the_figures_were_fitted_on(tmp_path):
    line = cost_model()["calibration"]["fitted_on"]
    assert line == fitted_on() and "AlexNet" in line and "LLM" in line and "held out: LLM rank 2" in line
    assert list(cost_model()["calibration"])[0] == "fitted_on"   # first in every report's calibration line
    est = price(_basis(), "Ascend910B2")
    assert est.calibration["fitted_on"] == line
    # comparing with a profile the figures were fitted on says so
    fitted = _export(tmp_path / FITTED_PROFILES["alexnet_l1"]["path"].rsplit("/", 1)[0], ranks=2)
    cmp = compare(est, fitted)
    assert cmp["calibration"]["in_sample"] == ["alexnet_l1"] and "in-sample" in cmp["calibration"]["note"]
    assert compare(est, _export(tmp_path / "mine", ranks=1))["calibration"]["in_sample"] == []
    # a local calibration names the profiles its factors were fitted on
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"version": 1, "chips": {"Ascend910B2": {"chip": "Ascend910B2", "units": {
        "cube": {"factor": 1.1}}, "profiles": ["/x/rank3_ascend_pt/ASCEND_PROFILER_OUTPUT/kernel_details.csv"]}}}))
    factors, source = calibration_factors(cal, "Ascend910B2")
    assert factors == {"cube": 1.1} and source.endswith("fitted on rank3_ascend_pt")


def _bench():
    spec = importlib.util.spec_from_file_location("npu_estimate_accuracy", ROOT / "bench" / "npu_estimate_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_leave_one_out_refits_what_the_held_out_profile_contributed_and_keeps_the_rest():
    bench = _bench()
    shipped = {"kernels": {"default_vector": {"unit": "vector", "gbps": 900, "floor_us": 1.5},
                           "Relu": {"unit": "vector", "gbps": 3313, "floor_us": 2},
                           "RmsNorm": {"unit": "vector", "gbps": 960, "floor_us": 8},
                           "Add": {"unit": "vector", "gbps": 793, "floor_us": 1},
                           "Conv2D": {"unit": "cube", "efficiency": {"default": 0.6, "fp32": 1.18}},
                           "MatMulV2": {"unit": "cube", "efficiency": {"default": 0.7, "fp32": 0.9},
                                        "memory_efficiency": 0.28}},
               "host": {"launch_us_per_op": 27.0}, "calibration": {"fitted_on": "both"}}
    a = {"hbm_gbps": 1600, "cube_tflops": {"fp32": 88.5, "fp16": 353.8, "bf16": 353.8}}

    def launch(profile, ktype, mb, us, unit="vector", dtype="float32", flops=0.0):
        return (profile, a, Kernel(type=ktype, unit=unit, bytes=mb * 1e6, dtype=dtype, flops=flops), us)
    samples = {"Relu": [launch("alexnet_l1", "Relu", 8, 4.4)] * 3,
               "RmsNorm": [launch("llm_r0", "RmsNorm", 64, 75)] * 3,
               "Add": [launch("alexnet_l1", "Add", 4, 6)] * 3 + [launch("llm_r0", "Add", 16, 21)] * 3,
               "Conv2D": [launch("alexnet_l1", "Conv2D", 20, 300, "cube", flops=2.7e10)],
               "MatMulV2": [launch("llm_r0", "MatMulV2", 50, 400, "cube", "bfloat16", 1e11),
                            launch("alexnet_l1", "MatMulV2", 160, 350, "cube", "float32", 2.4e9)]}
    model, changed = bench.refit(shipped, samples, "alexnet_l1")
    kernels = model["kernels"]
    assert "Relu" not in kernels                                  # AlexNet only: its prior (default_vector)
    assert kernels["RmsNorm"] == shipped["kernels"]["RmsNorm"]    # LLM only: untouched
    assert kernels["Add"] == {"unit": "vector", **bench._vector_figures(samples["Add"][3:])}   # the LLM's alone
    assert kernels["Conv2D"]["efficiency"] == {"default": 0.6}    # fp32 measured on AlexNet only
    assert kernels["MatMulV2"]["efficiency"] == {"default": 0.7}  # fp32 from AlexNet; bf16 (default) from the LLM
    assert "memory_efficiency" not in kernels["MatMulV2"] and "launch_us_per_op" not in model["host"]
    assert "fitted on the shared Megatron LLM" in model["calibration"]["fitted_on"]
    assert "AlexNet" in model["calibration"]["fitted_on"].split("held out:")[1]
    assert shipped["kernels"]["Relu"] and shipped["host"]["launch_us_per_op"] == 27.0   # the shipped model is left alone
    assert "Relu" in changed["to the prior"] and "Add" in changed["re-derived"]


@needs_shared
def test_the_shared_exports_world_size_and_chip_come_from_the_profile():
    world, source = world_size(ALEX / "rank0_ascend_pt")
    assert world == 8 and "HCCL group of 8 ranks" in source   # 2 of the 8 ranks were exported
    assert world_size(LLM / "rank_2_ascend_pt")[0] == 4
    assert chip_and_source(ALEX / "rank0_ascend_pt")[0] == "Ascend910B2"
    assert chip_and_source(LLM / "rank_2_ascend_pt")[0] == "Ascend910B3"


@needs_shared
def test_leave_one_out_on_the_shared_profiles_prices_without_the_held_out_profile():
    bench = _bench()
    shipped = cost_model()
    samples = bench.fit_samples(SHARED)
    model, _ = bench.refit(shipped, samples, "alexnet_l1")
    assert "TransData" not in model["kernels"] and "fp32" not in model["kernels"]["Conv2D"]["efficiency"]
    csv_path = bench.profile_csv(SHARED, "alexnet_l1")
    inside = bench.kernel_check(csv_path, "Ascend910B2")
    with bench.cost_model_as(model):
        assert cost_model() is model
        out = bench.kernel_check(csv_path, "Ascend910B2")
    assert cost_model() is shipped and out["within_2x"] < inside["within_2x"]
