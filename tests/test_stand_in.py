"""The CUDA stand-in holds for every caller on every torch build (issue 31).

Run on both builds by .ci/run: the CPU wheel (the README's set-up) and a CUDA wheel on this GPU-less machine
(what `pip install torch` gives most users), where any call that reaches the CUDA runtime dies with a driver
error.  Whether a device exists is answered to torch itself as the machine is, so its optimizers and
DataParallel take their CPU paths; the script and its libraries see the stand-in.
"""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SCRIPTS, load_scan

STAND_IN = SCRIPTS / "stand_in"
IMAGENET = SCRIPTS / "vendor" / "pytorch_examples" / "imagenet_main.py"
TV_SHIM = SCRIPTS / "frameworks" / "tv_shim"
CUDA_BUILD = torch.version.cuda is not None


def _needs(module: str):
    import importlib.util
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module} (the test extra)")


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # this index's torchvision for the CPU torch is a CUDA build (see tv_shim/sitecustomize.py)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TV_SHIM), env.get("PYTHONPATH")]))
    return env


def scan(out: Path, script: Path, *args: str, steps: int = 3, python: str = sys.executable,
         script_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [python, "-m", "opscope", "scan", str(script), "--steps", str(steps), "--out", str(out), "--format", "",
           "--quiet", *args]
    if script_args:
        cmd += ["--", *script_args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())


def _complete(data: dict) -> int:
    return sum(1 for s in data["steps"] if s["complete"])


def _line(script: Path, text: str) -> int:
    """The first code line holding ``text`` (the docstring above the imports is skipped)."""
    lines = script.read_text().splitlines()
    code = next(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    return next(i for i, line in enumerate(lines, start=1) if i > code and text in line)


def _findings(data: dict) -> dict:
    return {(f["rule"], f["line"]): f for f in data["findings"]}


@pytest.mark.parametrize("name", ["adamw_loop.py", "fused_adam.py"])
def test_adam_loops_scan_every_step(tmp_path, name):
    proc = scan(tmp_path, STAND_IN / name)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 3 and data["complete"]
    names = {op["name"] for op in data["operators"] if op["phase"] == "optimizer"}
    assert ("aten::_fused_adam_" in names) == (name == "fused_adam.py"), sorted(names)


def test_fused_adam_is_judged_against_an_older_torch_npu(tmp_path):
    proc = scan(tmp_path, STAND_IN / "fused_adam.py", "--target", "2.8.0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = {op["verdict"] for op in load_scan(tmp_path)["operators"] if op["name"] == "aten::_fused_adam_"}
    assert verdicts == {"cpu-fallback"}


def test_grad_scaler_synchronize_and_memory_stats_loop(tmp_path):
    script = STAND_IN / "sr_amp_sync.py"
    proc = scan(tmp_path, script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 3
    dtypes = {d for op in data["operators"] if op["phase"] == "forward" for d in op["dtypes"]}
    assert "c10::Half" in dtypes   # CUDA autocast's default float16, run as CPU autocast
    names = {op["name"] for op in data["operators"]}
    assert {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"} <= names
    found = _findings(data)
    assert ("cuda-synchronize", _line(script, "torch.cuda.synchronize()")) in found
    assert ("cuda-memory", _line(script, "torch.cuda.max_memory_allocated()")) in found


@_needs("torchvision")
def test_data_parallel_runs_as_one_replica_and_is_a_change_to_make(tmp_path):
    """pytorch/examples' ImageNet main.py, single node: `model.features = torch.nn.DataParallel(...)`."""
    proc = scan(tmp_path, IMAGENET, script_args=("--dummy", "-a", "alexnet", "-b", "4", "-j", "0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 3
    line = _line(IMAGENET, "model.features = torch.nn.DataParallel(model.features)")
    finding = _findings(data)[("data-parallel", line)]
    assert finding["origin"] == "static+runtime" and finding["severity"] == "warning"
    assert "DistributedDataParallel" in finding["replacement"] and "one replica" in finding["remapped_to"]
    assert any(op["name"] == "aten::convolution_backward" for op in data["operators"])


def test_a_cuda_graph_capture_stops_with_one_line_and_keeps_the_steps(tmp_path):
    script = STAND_IN / "graph_capture.py"
    proc = scan(tmp_path, script, steps=5)
    assert proc.returncode == 3
    line = _line(script, "graph = torch.cuda.CUDAGraph()")
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("opscope: error: the script raised CudaRuntimeNeeded: torch.cuda.CUDAGraph() needs the "
                            "CUDA runtime of a real GPU"), error
    assert f"graph_capture.py:{line} during step 4" in error and "Traceback" not in proc.stderr
    data = load_scan(tmp_path)
    assert _complete(data) == 3
    found = _findings(data)
    finding = found[("cuda-graph", line)]   # the static rule's id: one finding, both origins
    assert finding["origin"] == "static+runtime" and "NPUGraph" in finding["replacement"]
    assert found[("cuda-nvtx", _line(script, "range_push"))]["remapped_to"] == "no-op"   # none on a CPU build


@pytest.mark.skipif(not CUDA_BUILD, reason="a CPU build has no torch._C._cuda_synchronize")
def test_a_private_cuda_binding_is_named_not_a_driver_error(tmp_path):
    script = STAND_IN / "private_cuda_call.py"
    proc = scan(tmp_path, script, steps=5)
    assert proc.returncode == 3
    error = proc.stderr.strip().splitlines()[-1]
    assert "CudaRuntimeNeeded: torch._C._cuda_synchronize() needs the CUDA runtime" in error, error
    assert "driver" not in error and f"private_cuda_call.py:{_line(script, '_cuda_synchronize()')}" in error
    assert _complete(load_scan(tmp_path)) == 3


def _trainer_args(out: Path, precision: str) -> tuple[str, ...]:
    return ("--output_dir", str(out), "--per_device_train_batch_size", "4", "--max_steps", "6", "--report_to", "none",
            "--save_strategy", "no", f"--{precision}")


@pytest.mark.slow
@_needs("transformers")
@pytest.mark.parametrize("precision,dtype", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_hf_trainer_on_a_tiny_llama_in_mixed_precision(tmp_path, precision, dtype):
    proc = scan(tmp_path, STAND_IN / "trainer_llama.py", script_args=_trainer_args(tmp_path / "trainer", precision))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 3
    precision_seen = data["summary"]["precision"]
    assert precision_seen["requested"] == [dtype] and precision_seen["recorded"] == [dtype]
    assert precision_seen["grad_scaler"]["recorded"] is (precision == "fp16")


@pytest.mark.slow
@_needs("transformers")
def test_llama_2_7b_gpu_script_scans_in_fake_mode(tmp_path):
    """transformers' LlamaForCausalLM at the 7B shape, .cuda(), CUDA bf16 autocast, AdamW: --mode fake."""
    proc = scan(tmp_path, STAND_IN / "hf_llama_7b_cuda.py", "--mode", "fake", steps=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 2 and data["fake_mode"]
    dtypes = {d for op in data["operators"] if op["phase"] == "forward" for d in op["dtypes"]}
    assert "c10::BFloat16" in dtypes
    assert any(op["name"] == "aten::_foreach_add_" or op["name"].startswith("aten::_fused_adamw")
               or op["name"] == "aten::addcdiv_" for op in data["operators"] if op["phase"] == "optimizer")


# -- the same scan on the other build --------------------------------------------------------------------------
OTHER = os.environ.get("OPSCOPE_OTHER_TORCH_PYTHON")
COMPARED = [(STAND_IN / "adamw_loop.py", ()), (STAND_IN / "fused_adam.py", ()), (STAND_IN / "sr_amp_sync.py", ()),
            (IMAGENET, ("--dummy", "-a", "alexnet", "-b", "4", "-j", "0")),
            (STAND_IN / "trainer_llama.py", _trainer_args(Path("trainer-out"), "fp16"))]


def _what_a_scan_says(data: dict) -> dict:
    """What must not depend on the build: training operators with shapes, dtypes, phase and verdict; findings."""
    ops = sorted((op["name"], json.dumps(op["input_shapes"]), tuple(op["dtypes"]), op["phase"], op["verdict"])
                 for op in data["operators"] if op["phase"] in ("forward", "backward", "optimizer"))
    findings = sorted((f["rule"], f["line"], f["origin"]) for f in data["findings"])
    precision = {k: v for k, v in (data["summary"].get("precision") or {}).items() if k != "recorded_calls"}
    return {"complete": _complete(data), "operators": ops, "findings": findings, "exit": data["exit"]["kind"],
            "precision": precision}


@pytest.mark.skipif(not OTHER, reason="OPSCOPE_OTHER_TORCH_PYTHON names a python with the other torch build "
                                      "(.ci/run sets it)")
@pytest.mark.parametrize("script,args", COMPARED, ids=[s.name for s, _ in COMPARED])
def test_a_cuda_build_scan_says_what_a_cpu_build_scan_says(tmp_path, script, args):
    args = tuple(str(tmp_path / a) if a == "trainer-out" else a for a in args)
    here = scan(tmp_path / "here", script, script_args=args)
    there = scan(tmp_path / "there", script, script_args=args, python=str(OTHER))
    assert here.returncode == 0 and there.returncode == 0, (here.stderr[-1500:], there.stderr[-1500:])
    mine, other = load_scan(tmp_path / "here"), load_scan(tmp_path / "there")
    assert {mine["torch_version"].endswith("+cpu"), other["torch_version"].endswith("+cpu")} == {True, False}
    assert _what_a_scan_says(mine) == _what_a_scan_says(other)


# -- a torch opscope cannot stand in for ------------------------------------------------------------------------
def test_the_supported_range_is_checked_from_the_version_string():
    from opscope.errors import UserError
    from opscope.torch_support import check_installed_torch, check_stand_in_build
    for fine in ("2.4.0", "2.13.0+cpu", "2.14.1", "2.15.0.dev20261101+cu130"):
        check_installed_torch(fine)
    for old in ("2.3.1", "2.1.0+cu121", "1.13.1", "3.0.0"):
        with pytest.raises(UserError, match=rf"torch {re.escape(old)} is outside the range opscope supports "
                                            r"\(torch 2\.4 or newer"):
            check_installed_torch(old)
    check_stand_in_build("2.14.1", None)
    with pytest.raises(UserError, match=r"torch 2\.5\.1\+rocm6\.2 is a ROCm build \(HIP 6\.2\)"):
        check_stand_in_build("2.5.1+rocm6.2", "6.2")


def _scan_with_site(tmp_path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "opscope", "scan", str(STAND_IN / "adamw_loop.py"), "--out",
                           str(tmp_path / "run"), "--format", "", "-q"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def test_a_torch_older_than_the_range_is_one_line_exit_2(tmp_path):
    site = tmp_path / "site"
    (site / "torch-2.1.0.dist-info").mkdir(parents=True)   # what importlib.metadata finds first
    (site / "torch-2.1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.1.0\n")
    proc = _scan_with_site(tmp_path, site)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("opscope: error: torch 2.1.0 is outside the range opscope supports (torch 2.4 or "
                                   "newer (2.x), CPU or CUDA build); install a supported torch in this environment, "
                                   "e.g. `pip install \"torch>=2.4,<3\"`")
    assert not (tmp_path / "run").exists()


def test_a_rocm_build_is_refused_in_one_line(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    # every process of the scan sees a ROCm build: torch.version.hip set, as a ROCm wheel has it
    (site / "sitecustomize.py").write_text("import torch\ntorch.version.hip = '6.2.41133'\n")
    proc = _scan_with_site(tmp_path, site)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"opscope: error: torch {torch.__version__} is a ROCm build (HIP 6.2.41133): opscope's "
                           "CPU stand-in for CUDA supports torch 2.4 or newer"), line


def test_the_scripts_own_profiler_is_stood_in_not_a_crash(tmp_path):
    """Two Kineto sessions in one process die of SIGSEGV: the script's profiler records nothing during the scan."""
    script = STAND_IN / "own_profiler.py"
    proc = scan(tmp_path, script)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 3
    assert any(op["name"] == "aten::addmm" and op["phase"] == "forward" for op in data["operators"])
    finding = _findings(data)[("script-profiler", _line(script, "with profile("))]
    assert finding["api"] == "torch.profiler.profile()" and "torch_npu.profiler.profile" in finding["replacement"]
