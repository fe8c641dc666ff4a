"""`opscope scan` end to end, on scripts written like real training scripts."""
from __future__ import annotations

import csv
import json

import pytest

from conftest import EXAMPLES, SCRIPTS, bench_module, load_scan, run_opscope


def test_example_scan_writes_scan_json_csv_and_traces(cnn_scan):
    scan = load_scan(cnn_scan)
    assert scan["schema"] == "opscope.scan/1"
    assert scan["complete"] is True and scan["incomplete_reason"] is None
    assert scan["device"] == "cpu" and scan["torch_version"]
    assert [s["index"] for s in scan["steps"]] == [1, 2, 3]
    names = {op["name"] for op in scan["operators"]}
    assert {"aten::conv2d", "aten::addmm", "aten::convolution_backward"} <= names
    phases = {op["phase"] for op in scan["operators"]}
    assert {"forward", "backward", "optimizer"} <= phases
    for op in scan["operators"]:
        assert set(op) >= {"name", "overload", "input_shapes", "dtypes", "calls", "self_time_us", "phase",
                           "source", "dynamic"}
    # every trace listed exists and is a Chrome trace
    assert len(scan["traces"]) == 3
    for rel in scan["traces"]:
        trace = json.loads((cnn_scan / rel).read_text())
        assert any(ev.get("name") == "aten::addmm" for ev in trace["traceEvents"])
    rows = list(csv.DictReader(open(cnn_scan / "operators.csv")))
    assert len(rows) == len(scan["operators"])


def test_forward_ops_point_at_user_model_lines(cnn_scan):
    scan = load_scan(cnn_scan)
    src = (EXAMPLES / "train_cnn.py").read_text().splitlines()
    conv = [op for op in scan["operators"] if op["name"] == "aten::conv2d"]
    assert conv
    for op in conv:
        file, line = op["source"].rsplit(":", 1)
        assert file == "train_cnn.py"
        assert "self.conv" in src[int(line) - 1]
    # backward ops are attributed to the forward line that created them, not to loss.backward()
    conv_bw = [op for op in scan["operators"] if op["name"] == "aten::convolution_backward"]
    assert conv_bw and all("self.conv" in src[int(op["source"].rsplit(":", 1)[1]) - 1] for op in conv_bw)


def test_fixed_shape_cnn_has_no_dynamic_ops(cnn_scan):
    scan = load_scan(cnn_scan)
    assert scan["dynamic_shapes"] == [] and scan["root_causes"] == []
    assert not any(op["dynamic"] for op in scan["operators"])


def test_gpu_style_script_runs_on_cpu_and_reports_each_remap(tmp_path):
    script = SCRIPTS / "gpu_style_train.py"
    proc = run_opscope("scan", script, "--steps", "3", "--out", tmp_path, "--quiet", "--format", "",
                       "--", "--batch-size", "8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    scan = load_scan(tmp_path)
    assert scan["complete"]
    lines = script.read_text().splitlines()

    def line_of(text):
        return next(i for i, l in enumerate(lines, 1) if text in l)

    runtime = {(f["rule"], f["line"]) for f in scan["findings"] if "runtime" in f["origin"]}
    expected = {
        ("cuda-is-available", line_of("torch.cuda.is_available()")),
        ("cuda-set-device", line_of("torch.cuda.set_device(0)")),
        ("cudnn-flags", line_of("cudnn.benchmark")),
        ("pin-memory", line_of("pin_memory=True")),
        ("cuda-call", line_of("build_model().cuda()")),
        ("cuda-device", line_of("nn.CrossEntropyLoss().to(device)")),
        ("cuda-amp-gradscaler", line_of("GradScaler()")),
        ("cuda-call", line_of("x = x.cuda(")),
        ("cuda-device", line_of("y = y.to(device)")),
        ("cuda-amp-autocast", line_of("amp.autocast()")),
        ("cuda-synchronize", line_of("torch.cuda.synchronize()")),
        ("cuda-memory", line_of("max_memory_allocated")),
    }
    assert expected <= runtime, expected - runtime
    for f in scan["findings"]:
        assert f["file"] == "gpu_style_train.py" and f["replacement"]


def _roots(scan):
    return {(rc["source"], rc["cause"]) for rc in scan["root_causes"]}


def test_dynamic_shapes_root_causes_and_classes(dynamic_scan):
    scan = load_scan(dynamic_scan)
    lines = (EXAMPLES / "train_dynamic.py").read_text().splitlines()

    def at(text):
        return f"train_dynamic.py:{next(i for i, l in enumerate(lines, 1) if text in l)}"

    roots = _roots(scan)
    assert (at("scores[mask]"), "data-dependent-output") in roots
    assert (at("torch.nonzero("), "data-dependent-output") in roots
    assert (at("torch.masked_select("), "data-dependent-output") in roots
    loader = at("loader = DataLoader(")
    assert (loader, "input-varies") in roots
    rc = next(r for r in scan["root_causes"] if r["source"] == loader)
    dims = {d["dim"] for d in rc["varying_dims"]}
    assert {0, 1} <= dims  # last partial batch (dim 0) and per-batch sequence length (dim 1)
    assert "drop_last=True" in rc["suggestion"]
    # `mask = tokens > 50` only builds the mask: the boolean indexing on the next line is the cause
    assert not any(rc["source"] == at("mask = tokens > 50") for rc in scan["root_causes"])
    # grouping: far fewer root causes than dynamic operators
    assert len(scan["root_causes"]) <= 8 < len(scan["dynamic_shapes"])
    for d in scan["dynamic_shapes"]:
        assert d["cause"] in ("input-varies", "data-dependent-output", "host-sync") and d["suggestion"]


def test_backend_private_ops_are_folded_into_their_parent(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "fp32_cnn.py", "--steps", "2", "--out", tmp_path, "--quiet", "--format", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    names = {op["name"] for op in scan["operators"]}
    assert not any(n.startswith(("aten::mkldnn_", "aten::_nnpack", "aten::thnn_", "aten::_slow_conv2d"))
                   for n in names)
    conv = [op for op in scan["operators"] if op["name"] == "aten::_convolution"]
    assert conv and any("aten::mkldnn_convolution (backend-private)" in op["children"] for op in conv)


def test_script_raising_at_step_3_keeps_steps_1_and_2(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "crash_at_step3.py", "--steps", "5", "--out", tmp_path, "--quiet",
                       "--format", "")
    assert proc.returncode == 3
    err = proc.stderr.strip().splitlines()
    ours = [line for line in err if line.startswith("opscope")]
    assert len(ours) == 1 and ours[0] == err[-1] and ours[0].startswith("opscope: error:"), proc.stderr
    assert "RuntimeError: bad batch at step 3" in ours[0] and "crash_at_step3.py:" in ours[0]
    assert "USDT" not in proc.stderr
    assert "Traceback" not in proc.stderr
    scan = load_scan(tmp_path)
    assert scan["complete"] is False and "RuntimeError" in scan["incomplete_reason"]
    complete_steps = [s["index"] for s in scan["steps"] if s["complete"]]
    assert complete_steps == [1, 2]
    assert (tmp_path / "capture" / "script_traceback.txt").exists()


def test_timeout_ends_a_hanging_script_and_keeps_what_was_captured(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "hang_at_step2.py", "--steps", "5", "--timeout", "8", "--out", tmp_path,
                       "--quiet", "--format", "")
    assert proc.returncode == 4, proc.stderr
    assert "--timeout" in proc.stderr and "Traceback" not in proc.stderr
    scan = load_scan(tmp_path)
    assert scan["complete"] is False and scan["exit"]["kind"] == "timeout"
    assert [s["index"] for s in scan["steps"] if s["complete"]] == [1]


def test_sys_exit_nonzero_is_reported(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "exit_nonzero.py", "--steps", "4", "--out", tmp_path, "--quiet",
                       "--format", "")
    assert proc.returncode == 3
    assert "exited with status 2" in proc.stderr
    assert load_scan(tmp_path)["complete"] is False


def test_inference_loop_uses_module_calls_as_steps(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "inference_loop.py", "--steps", "3", "--out", tmp_path, "--quiet",
                       "--format", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert [s["index"] for s in scan["steps"]] == [1, 2, 3]
    assert any(op["name"] == "aten::linear" for op in scan["operators"])


@pytest.mark.parametrize("args, message", [
    (["scan", "no_such_script.py"], "script not found"),
    (["scan", "pyproject.toml"], "not a Python script"),
    (["scan", "examples/train_cnn.py", "--steps", "0"], "--steps"),
    (["scan", "examples/train_cnn.py", "--out", "/proc/opscope-cannot-write"], "cannot write to --out"),
    (["scan", "examples/train_cnn.py", "--device", "tpu"], "unknown --device"),
])
def test_bad_arguments_give_one_line_errors(args, message):
    proc = run_opscope(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
def test_scan_on_cuda_records_device_time(tmp_path):
    """On a GPU, every operator of scan.json that launched kernels (as the exported traces show it: a
    kernel carries the External id of the operator around its launch) holds device time: the convolutions'
    backward and the classifier's addmm among them."""
    gpu_check = bench_module("gpu_check")
    proc = run_opscope("scan", EXAMPLES / "train_cnn.py", "--device", "cuda", "--steps", "3", "--out", tmp_path,
                       "--quiet", "--format", "", "--", "--epochs", "1", gpu=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert scan["device"] == "cuda" and not [f for f in scan["findings"] if f["origin"] == "runtime"]
    launched = gpu_check.trace_device_time(gpu_check.trace_paths(tmp_path, scan))["by_op"]
    assert launched.get("aten::addmm", 0) > 0 and launched.get("aten::convolution_backward", 0) > 0
    assert gpu_check.silent_launchers(scan, launched) == []
    for name in ("aten::addmm", "aten::convolution_backward"):
        ops = [op for op in scan["operators"] if op["name"] == name and op["on_device"]]
        assert ops and all(op["device_time_us"] > 0 for op in ops), name
    # the forward convolution's cuDNN kernels: on the public op the backend kernel is folded into
    forward = ("aten::conv2d", "aten::convolution", "aten::_convolution")
    assert sum(op["device_time_us"] for op in scan["operators"] if op["name"] in forward) > 0


def test_host_only_data_loading_is_not_an_npu_candidate(cnn_scan):
    scan = load_scan(cnn_scan)
    by_name = {}
    for op in scan["operators"]:
        by_name.setdefault(op["name"], []).append(op)
    # the DataLoader's shuffle and collate run on host tensors in the GPU script too
    assert all(not op["on_device"] for op in by_name["aten::randperm"])
    assert all(not op["on_device"] for op in by_name["aten::stack"])
    assert all(op["on_device"] for op in by_name["aten::conv2d"] + by_name["aten::convolution_backward"])
    assert any("only ran on host tensors" in note for note in scan["notes"])


def test_huber_example_reports_cpu_fallback_with_substitute_and_time_share(huber_scan):
    scan = load_scan(huber_scan)
    assert scan["target"]["version"] == "2.14.0"
    huber = [op for op in scan["operators"] if op["name"] == "aten::huber_loss"]
    assert huber and all(op["verdict"] == "cpu-fallback" for op in huber)
    assert huber[0]["substitute"] and "smooth_l1_loss" in huber[0]["substitute"]["replacement"]
    assert huber[0]["evidence"]["checked"]  # the evidence chain, not the name alone
    summary = scan["summary"]
    assert 0 < summary["cpu_fallback_time_share"] < 1 and summary["verdict_counts"]["cpu-fallback"] >= 1
    assert 0 <= summary["readiness_score"] <= 100


def test_fail_under_gates_on_the_readiness_score(tmp_path):
    proc = run_opscope("scan", EXAMPLES / "train_huber.py", "--steps", "2", "--out", tmp_path, "--quiet",
                       "--format", "", "--fail-under", "100")
    assert proc.returncode == 5 and "below --fail-under" in proc.stderr
    proc = run_opscope("scan", "examples/train_huber.py", "--target", "9.9.9")
    assert proc.returncode == 2 and "9.9.9" in proc.stderr and "Traceback" not in proc.stderr


def test_optimizer_post_hook_work_stays_in_its_step_and_does_not_crash_the_scan(tmp_path):
    """A global optimizer post-hook (an EMA update) runs inside ``Optimizer.step``'s profiler range:
    ending the step there stopped the profiler under an open range and the next step died of SIGSEGV."""
    proc = run_opscope("scan", SCRIPTS / "optimizer_post_hook.py", "--steps", "3", "--out", tmp_path,
                       "--format", "", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert [s["index"] for s in data["steps"] if s["complete"]] == [1, 2, 3]
    lerp = [op for op in data["operators"] if op["name"] == "aten::lerp_"]
    assert lerp and all(op["phase"] == "optimizer" and op["steps"] == [1, 2, 3] for op in lerp), lerp


def test_a_step_ends_after_the_scripts_own_profiler_range_closes(tmp_path):
    """Each iteration inside the author's ``record_function`` range, the loss read after the optimizer
    step within it: the step ends when the range closes, so that read stays in its own step (it used to
    open the next one, and the last step's was lost) and no range outlives the profiler session it began in."""
    script = SCRIPTS / "user_step_range.py"
    proc = run_opscope("scan", script, "--steps", "3", "--out", tmp_path, "--format", "", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert [s["index"] for s in data["steps"] if s["complete"]] == [1, 2, 3]
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "mul_(0.5)" in text)
    after_step = [op for op in data["operators"] if op["source"] == f"user_step_range.py:{line}"
                  and op["name"] in ("aten::clone", "aten::mul_")]
    assert len(after_step) == 2 and all(op["steps"] == [1, 2, 3] for op in after_step), after_step
