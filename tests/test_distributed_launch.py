"""Distributed training scripts scanned unmodified on a machine without GPUs (2 gloo ranks on the CPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from conftest import ROOT, SCRIPTS, load_scan

from opscope.capture.distributed import detect_launcher, parse_ranks, resolve
from opscope.errors import UserError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks /proc for leftover ranks")


def scan(script, out, *args, script_args=(), quiet=True):
    """Run `opscope scan` with a unique tag in its environment; return (process, leftover pids)."""
    tag = f"OPSCOPE_TEST_TAG={uuid.uuid4().hex}"
    env = dict(os.environ, OPSCOPE_TEST_TAG=tag.split("=", 1)[1])
    cmd = [sys.executable, "-m", "opscope", "scan", str(script), "--out", str(out), "--format", "", *map(str, args)]
    if quiet:
        cmd.append("--quiet")
    proc = subprocess.run(cmd + ["--", *map(str, script_args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    return proc, _tagged_processes(tag)


def _tagged_processes(tag: str) -> list[str]:
    """Processes (any descendant: ranks, DataLoader workers) still carrying the tag in their environment."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if tag.encode() in fh.read().split(b"\0"):
                    with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                        cmdline = cmd.read().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{pid}: {cmdline}")
        except OSError:
            continue
    return found


def line_of(script, text: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def findings_at(scan_data) -> set:
    return {(f["rule"], f["line"]) for f in scan_data["findings"]}


def assert_trained(scan_data, steps: int) -> None:
    assert scan_data["complete"], scan_data["incomplete_reason"]
    assert [s["index"] for s in scan_data["steps"] if s["complete"]] == list(range(1, steps + 1))
    names = {op["name"] for op in scan_data["operators"]}
    assert {"aten::convolution_backward", "aten::native_layer_norm", "aten::native_layer_norm_backward"} <= names \
        or {"aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::addmm"} <= names, sorted(names)
    assert any(n.startswith("c10d::allreduce") for n in names), "DDP's gradient all-reduce was not captured"


# -- detection (no subprocess) -------------------------------------------------------------
def test_launcher_is_read_from_the_script(tmp_path):
    assert detect_launcher(SCRIPTS / "ddp_spawn_train.py") == ("spawn", None)
    assert detect_launcher(SCRIPTS / "ddp_torchrun_train.py") == ("torchrun", None)
    assert detect_launcher(SCRIPTS / "ddp_launch_legacy.py") == ("torchrun", "--local_rank")
    assert detect_launcher(SCRIPTS / "ddp_process_tutorial.py") == ("spawn", None)
    assert detect_launcher(SCRIPTS / "gpu_style_train.py") == ("none", None)
    aliased = tmp_path / "a.py"
    aliased.write_text("from torch.multiprocessing import start_processes as go\nimport torch.distributed as d\n"
                       "def f(i): d.init_process_group('gloo', init_method='tcp://x:1', rank=i, world_size=2)\n"
                       "go(f, nprocs=2)\n")
    assert detect_launcher(aliased)[0] == "spawn"
    explicit = tmp_path / "b.py"  # rank and world size given by the script itself: nothing to launch
    explicit.write_text("import torch.distributed as dist\n"
                        "dist.init_process_group('nccl', init_method='tcp://h:1', rank=0, world_size=1)\n")
    assert detect_launcher(explicit)[0] == "none"
    env_only = tmp_path / "c.py"
    env_only.write_text("import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n")
    assert detect_launcher(env_only)[0] == "torchrun"


def test_launch_plan_options():
    plan = resolve("auto", SCRIPTS / "ddp_torchrun_train.py", None, "all")
    assert plan is not None and plan.launcher == "torchrun" and plan.world_size == 2 and plan.ranks == (0, 1)
    spawn = resolve("auto", SCRIPTS / "ddp_spawn_train.py", 4, "2")
    assert spawn is not None and spawn.ranks == (0, 2)
    assert resolve("none", SCRIPTS / "ddp_spawn_train.py", None, "0") is None
    assert parse_ranks("all", 3) == [0, 1, 2]
    with pytest.raises(UserError, match="outside the world size"):
        parse_ranks("5", 2)
    with pytest.raises(UserError, match="distributed launch"):
        resolve("auto", SCRIPTS / "gpu_style_train.py", 4, "0")


# -- end to end ------------------------------------------------------------------------------
def test_mp_spawn_ddp_script_captures_rank0_with_its_distributed_findings(tmp_path):
    script = SCRIPTS / "ddp_spawn_train.py"
    proc, left = scan(script, tmp_path, "--steps", "3", "--ranks", "all", quiet=False, script_args=["--sync-bn"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, left
    assert "torch.cuda.device_count() = 2" in proc.stderr          # the world size used is printed
    data = load_scan(tmp_path)
    assert_trained(data, 3)
    assert data["settings"]["distributed"]["launcher"] == "spawn"
    runtime = {(f["rule"], f["line"]) for f in data["findings"] if "runtime" in f["origin"]}
    assert {("nccl-backend", line_of(script, 'init_process_group("nccl"')),
            ("cuda-set-device", line_of(script, "torch.cuda.set_device(rank)")),
            ("ddp-device-ids", line_of(script, "device_ids=[rank]")),
            ("cuda-call", line_of(script, "Net().cuda(rank)")),
            ("cuda-device-count", line_of(script, "torch.cuda.device_count()")),
            ("sync-batchnorm", line_of(script, "self.bn(self.conv(x))"))} <= runtime
    assert ("nccl-env", line_of(script, "NCCL_DEBUG")) in findings_at(data)
    nccl = next(f for f in data["findings"] if f["rule"] == "nccl-backend")
    assert "hccl" in nccl["replacement"]
    count = next(f for f in data["findings"] if f["rule"] == "cuda-device-count")
    assert count["remapped_to"].startswith("returns 2: this run's world size")   # what this run was answered
    ops = {op["name"]: op for op in data["operators"]}
    assert ops["aten::conv2d"]["source"] == f"ddp_spawn_train.py:{line_of(script, 'self.bn(self.conv(x))')}"
    rank1 = load_scan(tmp_path / "rank1")
    assert_trained(rank1, 3)
    assert rank1["settings"]["rank"] == 1 and ("nccl-backend", nccl["line"]) in findings_at(rank1)
    assert not any(op["verdict"] == "unknown" for op in data["operators"])


def test_torchrun_style_script_gets_ranks_from_opscope_and_ranks_all_writes_a_folder_per_rank(tmp_path):
    script = SCRIPTS / "ddp_torchrun_train.py"
    proc, left = scan(script, tmp_path, "--steps", "3", "--ranks", "all")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, left
    for rank, folder in ((0, tmp_path), (1, tmp_path / "rank1")):
        data = load_scan(folder)
        assert_trained(data, 3)
        assert data["settings"]["rank"] == rank
        assert data["settings"]["distributed"]["rank_dirs"] == {"0": ".", "1": "rank1"}
        assert all((folder / t).is_file() for t in data["traces"])
        assert {("nccl-backend", line_of(script, 'init_process_group(backend="nccl"')),
                ("cuda-device", line_of(script, "device_id=device")),
                ("cuda-set-device", line_of(script, "set_device(local_rank)")),
                ("ddp-device-ids", line_of(script, "device_ids=[local_rank]"))} <= findings_at(data)


def test_one_process_per_rank_launch_of_the_distributed_tutorial(tmp_path):
    script = SCRIPTS / "ddp_process_tutorial.py"
    proc, left = scan(script, tmp_path, "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, left
    data = load_scan(tmp_path)
    assert data["complete"] and len([s for s in data["steps"] if s["complete"]]) == 3
    assert {"aten::native_layer_norm_backward", "aten::addmm"} <= {op["name"] for op in data["operators"]}
    runtime = {(f["rule"], f["line"]) for f in data["findings"] if "runtime" in f["origin"]}
    assert {("nccl-backend", line_of(script, "dist.init_process_group(backend")),
            ("cuda-set-device", line_of(script, "torch.cuda.set_device(rank)")),
            ("cuda-device", line_of(script, "nn.Linear(16, 5)).to(rank)")),      # an int device is cuda:N
            ("cuda-device", line_of(script, "torch.randn(20, 10).to(rank)")),
            ("cuda-device", line_of(script, "device=rank)")),
            ("cuda-device-count", line_of(script, "world_size = torch.cuda.device_count()"))} <= runtime


def test_legacy_local_rank_argument_is_passed_and_other_ranks_are_not_captured(tmp_path):
    script = SCRIPTS / "ddp_launch_legacy.py"
    proc, left = scan(script, tmp_path, "--steps", "3", "--world-size", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left, left
    data = load_scan(tmp_path)
    assert data["complete"] and len([s for s in data["steps"] if s["complete"]]) == 3
    assert data["argv"][-1] == "--local_rank=0"
    assert ("cuda-set-device", line_of(script, "set_device(args.local_rank)")) in findings_at(data)
    assert not (tmp_path / "rank1").exists()       # rank 1 ran remapped, not captured
    assert any("were not captured" in note for note in data["notes"])


def test_a_crashing_spawned_rank_stops_the_run_with_exit_3_and_leaves_no_process(tmp_path):
    script = SCRIPTS / "ddp_spawn_train.py"
    proc, left = scan(script, tmp_path, "--steps", "6", script_args=["--crash-rank", "1", "--crash-step", "2"])
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert not left, left
    error = [line for line in proc.stderr.splitlines() if line.startswith("opscope: error:")]
    assert len(error) == 1
    assert "lost its data shard" in error[0] and "(rank 1)" in error[0], error[0]
    data = load_scan(tmp_path)
    assert data["complete"] is False and "(rank 1)" in data["incomplete_reason"]
    assert len([s for s in data["steps"] if s["complete"]]) >= 1     # rank 0's steps before the crash are kept


def test_a_crashing_torchrun_rank_stops_the_others(tmp_path):
    script = SCRIPTS / "ddp_launch_legacy.py"
    proc, left = scan(script, tmp_path, "--steps", "10", script_args=["--crash-rank", "1"])
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert not left, left
    error = [line for line in proc.stderr.splitlines() if line.startswith("opscope: error:")]
    assert len(error) == 1 and "NaN loss on rank 1" in error[0] and "(rank 1)" in error[0], error[0]


def test_the_rank_that_failed_first_is_named():
    from opscope.capture.outcomes import culprit, rank_failure
    gloo = {"kind": "exception", "message": "RuntimeError: Connection closed by peer", "where": "t.py:40",
            "ended": 12.0}
    cause = {"kind": "exception", "message": "ValueError: NaN loss", "where": "t.py:52", "ended": 10.0}
    stopped = {"kind": "killed", "message": "interrupted", "ended": 11.0}
    assert culprit({0: gloo, 1: cause, 2: stopped}) == (1, cause)
    assert culprit({0: {"kind": "steps-reached", "ended": 1.0}, 1: stopped}) == (1, stopped)
    assert culprit({0: {"kind": "steps-reached"}, 1: {"kind": "exit", "code": 0}}) is None
    assert rank_failure(1, cause)["where"] == "t.py:52 (rank 1)"
    assert rank_failure(2, stopped)["message"] == "rank 2: interrupted"
