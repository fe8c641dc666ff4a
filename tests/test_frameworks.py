"""Framework training code scanned as the program it is on a GPU (issue 20, Required 1, 2 and 6).

The scripts under tests/data/scripts/frameworks/ are written in each framework's own idiom
(HF Trainer, accelerate, Lightning, timm's train.py, nanoGPT's train.py) with tiny configs and
local synthetic data.  On this CPU-only machine every caller -- the script and the framework --
must see the CUDA stand-in, so the precision the script asks for is the precision recorded;
and a script is launched as its user launches it (one process unless it needs a launcher;
the wrapper's process count and mixed precision when it comes after `--`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, load_scan

FRAMEWORKS = SCRIPTS / "frameworks"


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true", PL_DISABLE_FORK="1")
    # this index's torchvision is a CUDA build: transformers and timm import it (see tv_shim/sitecustomize.py)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FRAMEWORKS / "tv_shim"), env.get("PYTHONPATH")]))
    return env


def scan(out: Path, *command, steps: int = 2, script: str | None = None) -> subprocess.CompletedProcess:
    """`opscope scan [SCRIPT] --steps N --out OUT -- COMMAND...` as a user types it."""
    head = [str(FRAMEWORKS / script)] if script else []
    args = [sys.executable, "-m", "opscope", "scan", *head, "--steps", str(steps), "--out", str(out), "--quiet",
            "--format", "", "--", *map(str, command)]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())


def _dtypes(scan_json) -> set[str]:
    return {d for op in scan_json["operators"] if op["phase"] != "other" for d in op["dtypes"]}


def _names(scan_json) -> set[str]:
    return {op["name"] for op in scan_json["operators"]}


SCALER_OPS = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}


def _complete(scan_json) -> int:
    return sum(1 for s in scan_json["steps"] if s["complete"])


def _line_of(script: str, text: str) -> int:
    lines = (FRAMEWORKS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


# -- fast: no scan -----------------------------------------------------------------------------
def test_reading_rank_with_a_fallback_needs_no_launcher(tmp_path):
    from opscope.capture.distributed import detect_launcher
    assert detect_launcher(FRAMEWORKS / "nanogpt_train.py") == ("none", None)
    assert detect_launcher(FRAMEWORKS / "timm_train.py")[0] == "none"   # --local_rank default=0
    cases = {
        "import os\nrank = int(os.environ['RANK'])\n": "torchrun",
        "import os\nrank = int(os.environ.get('LOCAL_RANK'))\n": "torchrun",
        "import os\nrank = int(os.environ.get('RANK', -1))\n": "none",
        "import os\nif 'WORLD_SIZE' in os.environ:\n    world = int(os.environ['WORLD_SIZE'])\n": "none",
        "import os\ntry:\n    rank = int(os.environ['RANK'])\nexcept KeyError:\n    rank = 0\n": "none",
        "import torch.distributed as dist\ndef main():\n    dist.init_process_group('nccl')\n"
        "if __name__ == '__main__':\n    main()\n": "torchrun",
        "import os, torch.distributed as dist\nif os.environ.get('RANK'):\n    dist.init_process_group('nccl')\n": "none",
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, default=-1)\n": "none",
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--local_rank', type=int, required=True)\n":
            "torchrun",
    }
    for i, (source, expected) in enumerate(cases.items()):
        path = tmp_path / f"s{i}.py"
        path.write_text(source)
        assert detect_launcher(path)[0] == expected, source


def test_launch_wrappers_are_unwrapped(tmp_path):
    from opscope.capture.wrappers import unwrap
    from opscope.errors import UserError
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    acc = unwrap("accelerate", ["launch", "--num_processes=2", "--mixed_precision", "fp16", "--multi_gpu",
                                str(train), "--lr", "1"])
    assert (acc.script, acc.args, acc.world_size, acc.precision) == (str(train), ["--lr", "1"], 2, "fp16")
    assert acc.env == {"ACCELERATE_MIXED_PRECISION": "fp16"}
    assert unwrap("/usr/local/bin/accelerate", ["launch", str(train)]).world_size == 1
    run = unwrap("torchrun", ["--standalone", "--nproc_per_node", "4", str(train), "--x"])
    assert (run.wrapper, run.world_size, run.args) == ("torchrun", 4, ["--x"])
    mod = unwrap("python3", ["-m", "torch.distributed.run", "--nproc-per-node=2", str(train)])
    assert (mod.wrapper, mod.world_size, mod.script) == ("torchrun", 2, str(train))
    lt = unwrap("lightning", ["run", "model", "--accelerator", "gpu", "--devices", "2", "--precision",
                              "16-mixed", str(train)])
    assert (lt.world_size, lt.env["LT_PRECISION"], lt.env["LT_ACCELERATOR"]) == (2, "16-mixed", "gpu")
    ds = unwrap("deepspeed", ["--num_gpus", "2", str(train), "--deepspeed", "ds.json"])
    assert (ds.world_size, ds.args) == (2, ["--deepspeed", "ds.json"])
    assert unwrap(str(train), []) is None     # the script itself
    with pytest.raises(UserError, match="no training script"):
        unwrap("torchrun", ["--nproc_per_node", "2"])
    with pytest.raises(UserError, match="script not found"):
        unwrap("accelerate", ["launch", str(tmp_path / "missing.py")])


def test_precision_mismatch_is_said():
    from opscope.analysis.precision import precision_summary
    from opscope.model import Operator
    fp32 = [Operator(name="aten::addmm", dtypes=["float", "float", "float"], calls=4, phase="forward")]
    half = [Operator(name="aten::addmm", dtypes=["c10::Half", "c10::Half", "c10::Half"], calls=4, phase="forward"),
            Operator(name="aten::_amp_update_scale_", dtypes=["float"], calls=1, phase="optimizer")]
    asked = {"autocast": ["float16"], "grad_scaler": ["enabled"], "libraries": ["transformers"]}
    missed = precision_summary(asked, fp32, "cpu")
    assert missed["requested"] == ["float16"] and missed["recorded"] == ["float32"]
    assert "did not measure the mixed-precision program" in missed["note"]
    ok = precision_summary(asked, half, "cpu")
    assert ok["recorded"] == ["float16"] and ok["grad_scaler"] == {"requested": True, "recorded": True}
    assert ok["note"] is None
    assert precision_summary({}, half, "cpu")["note"] is None    # model.half() / CPU autocast by the script
    cpu_path = precision_summary({"cpu_autocast": ["lightning (bfloat16)"]}, half, "cpu")
    assert "lightning (bfloat16)" in cpu_path["note"] and "CPU-only" in cpu_path["note"]


# -- scans -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_nanogpt_train_is_one_process_in_bf16_as_on_an_a100(tmp_path):
    proc = scan(tmp_path, script="nanogpt_train.py", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert "distributed" not in data["settings"]          # one process, as `python train.py` runs it
    assert _complete(data) == 2
    assert "c10::BFloat16" in _dtypes(data) and "c10::Half" not in _dtypes(data)
    precision = data["summary"]["precision"]
    assert precision["requested"] == ["bfloat16"] and precision["recorded"] == ["bfloat16"]
    assert precision["grad_scaler"]["requested"] is False     # GradScaler(enabled=(dtype == 'float16'))
    found = {(f["rule"], f["line"]) for f in data["findings"]}
    assert ("cuda-api", _line_of("nanogpt_train.py", "torch.cuda.is_bf16_supported()")) in found
    assert ("cuda-amp-gradscaler", _line_of("nanogpt_train.py", "scaler = torch.cuda.amp.GradScaler(")) in found
    assert ("nccl-backend", _line_of("nanogpt_train.py", "backend = 'nccl'")) in found
    assert any(rule == "cuda-device" for rule, _ in found)


@pytest.mark.slow
def test_nanogpt_under_torchrun_gets_the_wrappers_ranks(tmp_path):
    proc = scan(tmp_path, "torchrun", "--standalone", "--nproc_per_node=2", FRAMEWORKS / "nanogpt_train.py",
                "--gradient_accumulation_steps=2", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert data["settings"]["distributed"]["world_size"] == 2
    assert data["settings"]["wrapper"]["name"] == "torchrun"
    assert _complete(data) == 2
    assert any(n.startswith("c10d::allreduce") for n in _names(data))


@pytest.mark.slow
def test_hf_trainer_fp16_records_float16_and_grad_scaler_work(tmp_path):
    proc = scan(tmp_path, FRAMEWORKS / "hf_trainer.py", "--output_dir", tmp_path / "run", "--fp16",
                "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "--max_steps", "5",
                "--report_to", "none", "--save_strategy", "no", script=None, steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 2
    assert "c10::Half" in _dtypes(data)
    assert SCALER_OPS <= _names(data)
    precision = data["summary"]["precision"]
    assert precision["recorded"] == ["float16"] and precision["note"] is None
    assert {"transformers", "accelerate"} <= set(precision["frameworks"])
    train_line = _line_of("hf_trainer.py", "trainer.train()")
    at_train = [f for f in data["findings"] if f["line"] == train_line and f["file"].endswith("hf_trainer.py")]
    # the framework's own CUDA calls are listed, as info naming the library: not a fix for the user's line
    assert at_train and all(f["rule"] == "framework-cuda" and f["severity"] == "info" for f in at_train)
    assert "transformers" in at_train[0]["api"] and at_train[0]["remapped_to"]


@pytest.mark.slow
def test_hf_trainer_bf16_scans(tmp_path):
    proc = scan(tmp_path, FRAMEWORKS / "hf_trainer.py", "--output_dir", tmp_path / "run", "--bf16",
                "--per_device_train_batch_size", "4", "--max_steps", "4", "--report_to", "none",
                "--save_strategy", "no", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert _complete(data) == 2 and "c10::BFloat16" in _dtypes(data)
    assert data["summary"]["precision"]["recorded"] == ["bfloat16"]
    # the optimizer the Trainer picks for a GPU (its default, fused AdamW), run as on the GPU
    optimizer = {o["name"] for o in data["operators"] if o["phase"] == "optimizer"}
    assert "aten::_fused_adamw_" in optimizer, sorted(optimizer)


@pytest.mark.slow
def test_accelerate_loop_plain_and_under_accelerate_launch_fp16(tmp_path):
    plain = scan(tmp_path / "plain", FRAMEWORKS / "accelerate_loop.py", "--batch_size", "8", steps=2)
    assert plain.returncode == 0, plain.stderr[-3000:]
    data = load_scan(tmp_path / "plain")
    assert _complete(data) == 2 and "c10::Half" not in _dtypes(data) and not SCALER_OPS & _names(data)
    assert data["summary"]["precision"]["recorded"] == ["float32"]
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    launched = subprocess.run(
        [sys.executable, "-m", "opscope", "scan", accelerate, "--steps", "2", "--out", str(tmp_path / "fp16"),
         "--quiet", "--format", "", "--", "launch", "--mixed_precision", "fp16",
         str(FRAMEWORKS / "accelerate_loop.py"), "--batch_size", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env())
    assert launched.returncode == 0, launched.stderr[-3000:]
    data = load_scan(tmp_path / "fp16")
    assert data["script"] == str(FRAMEWORKS / "accelerate_loop.py")
    assert data["settings"]["wrapper"]["mixed_precision"] == "fp16"
    assert _complete(data) == 2 and "c10::Half" in _dtypes(data) and SCALER_OPS <= _names(data)


@pytest.mark.slow
def test_lightning_gpu_16_mixed_records_float16(tmp_path):
    proc = scan(tmp_path, FRAMEWORKS / "lightning_train.py", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "No supported gpu backend" not in proc.stderr
    data = load_scan(tmp_path)
    assert _complete(data) == 2
    assert "c10::Half" in _dtypes(data) and "c10::BFloat16" not in _dtypes(data)   # not swapped for bf16
    assert SCALER_OPS <= _names(data)
    assert data["summary"]["precision"]["note"] is None


@pytest.mark.slow
def test_timm_train_runs_one_process_with_native_amp(tmp_path):
    proc = scan(tmp_path, FRAMEWORKS / "timm_train.py", "--amp", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert "distributed" not in data["settings"]
    assert _complete(data) == 2 and "c10::Half" in _dtypes(data) and SCALER_OPS <= _names(data)


def test_a_wrappers_precision_that_did_not_run_is_said():
    from opscope.analysis.precision import precision_summary
    from opscope.capture.wrappers import unwrap
    from opscope.model import Operator
    launched = unwrap("accelerate", ["launch", "--mixed_precision", "fp16", str(FRAMEWORKS / "accelerate_loop.py")])
    assert launched.dtype == "float16"
    fp32 = [Operator(name="aten::addmm", dtypes=["float", "float", "float"], calls=4, phase="forward")]
    summary = precision_summary({}, fp32, "cpu", launched.dtype)
    assert summary["requested"] == ["float16"] and "float16" in summary["note"]


@pytest.mark.slow
def test_every_cuda_query_answers_as_the_stand_in_device(tmp_path):
    import json

    from opscope.knowledge import load
    proc = scan(tmp_path, FRAMEWORKS / "gpu_report_train.py", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(next(line for line in proc.stdout.splitlines()
                             if line.startswith("GPU-REPORT "))[len("GPU-REPORT "):])
    device = load("runtime_remaps.yaml")["device"]
    assert (report["name"], report["capability"], report["total_memory"], report["sms"]) == (
        device["name"], device["capability"], device["total_memory"], device["multi_processor_count"])
    assert report["available"] and report["count"] == 1 and report["bf16"] is device["bf16_supported"]
    assert report["nccl"] and report["cuda_built"] and report["cudnn"] and report["rng_state_bytes"] > 0
    assert report["autocast_on"] and report["autocast_dtype"] == "torch.bfloat16" and report["step_ms"]
    data = load_scan(tmp_path)
    assert _complete(data) == 2 and "c10::BFloat16" in _dtypes(data)
    rules = {(f["rule"], f["line"]) for f in data["findings"]}
    assert ("cuda-manual-seed", _line_of("gpu_report_train.py", "torch.cuda.get_rng_state()")) in rules
    assert ("nccl-available", _line_of("gpu_report_train.py", "dist.is_nccl_available()")) in rules
    # torch.random.fork_rng saves the CUDA RNG state itself: answered, but not the script's own CUDA call
    fork = _line_of("gpu_report_train.py", "fork_rng(devices=[0])")
    assert not [r for r, line in rules if line == fork and r == "cuda-manual-seed"]


@pytest.mark.slow
def test_lightning_run_model_hands_its_precision_to_fabric(tmp_path):
    proc = scan(tmp_path, "lightning", "run", "model", "--accelerator", "cuda", "--precision", "16-mixed",
                FRAMEWORKS / "fabric_train.py", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = load_scan(tmp_path)
    assert data["settings"]["wrapper"]["env"]["LT_PRECISION"] == "16-mixed"
    assert _complete(data) == 2 and "c10::Half" in _dtypes(data) and SCALER_OPS <= _names(data)
