"""The stand-in records what a real GPU runs (issue 41): the top-level training operators and the optimizer's
kernels of the bundled CNN and of nanoGPT equal those of the same scripts scanned on an NVIDIA H200 by
bench/gpu_parity.py (tests/data/gpu_h200/real_size_top_level_ops.json), and nanoGPT's are those of karpathy/nanoGPT's
GPT-2 small there (tests/data/gpu_h200/top_level_ops.json, from ../shared/data/gpu_h200_torch2.11)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, bench_module, run_opscope

DATA = Path(__file__).resolve().parent / "data" / "gpu_h200" / "top_level_ops.json"
REAL_SIZE = DATA.with_name("real_size_top_level_ops.json")
# what the scripts differ in, not the stand-in: the GPU ran karpathy/nanoGPT, whose blocks call nn.Dropout
# (p=0.0 still records aten::dropout); tests/data/scripts/frameworks/nanogpt_train.py has no Dropout module
SCRIPT_ONLY = {"gpt2": {"aten::dropout"}}
# the comparison is bench/gpu_parity.py's, which a GPU machine runs on both sides (test_gpu.py)
parity = bench_module("gpu_parity")


def _top_level(run: Path) -> dict[str, set[str]]:
    from opscope.capture.store import load_capture
    return parity.top_level(load_capture(run).calls)


def _training_ops(phases: dict, scan: str, data: set[str]) -> set[str]:
    return parity.training_ops(phases, data, SCRIPT_ONLY.get(scan, set()))


_optimizer_kernels, _jaccard = parity.optimizer_kernels, parity.jaccard


def test_backend_kernels_are_compared_as_the_public_op_they_implement():
    """cuDNN's and FlashAttention's SDPA, the CPU's fused SDPA and cuDNN's batch norm count as the public op
    (backend_private_ops.yaml): the GPU and the stand-in run different kernels of the same operator."""
    assert {parity.public_op(f"aten::{k}") for k in ("_scaled_dot_product_cudnn_attention",
                                                       "_scaled_dot_product_flash_attention_for_cpu",
                                                       "_scaled_dot_product_efficient_attention")} == {
        "aten::scaled_dot_product_attention"}
    assert parity.public_op("aten::_scaled_dot_product_flash_attention_backward") == \
        parity.public_op("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == \
        "aten::scaled_dot_product_attention_backward"
    assert parity.public_op("aten::cudnn_batch_norm_backward") == "aten::native_batch_norm_backward"
    assert parity.public_op("aten::mm") == "aten::mm"


def test_two_runs_compare_from_their_folders(cnn_scan, tmp_path, capsys):
    """`bench/gpu_parity.py --compare A B` (no GPU needed): a run against itself is a full match, every step whole."""
    assert parity.main(["--compare", str(cnn_scan), str(cnn_scan)]) == 0
    table = capsys.readouterr().out
    assert "| 1.000 | yes / yes | same: aten::_foreach_add, aten::_foreach_add_, aten::_foreach_mul_ |" in table


@pytest.fixture(scope="module")
def gpu() -> dict:
    return {scan: {phase: set(names) for phase, names in phases.items()}
            for scan, phases in json.loads(DATA.read_text())["scans"].items()}


@pytest.fixture(scope="module")
def h200() -> dict:
    """The top-level operators of bench/gpu_parity.py's scripts scanned on an H200 with this version of opscope
    (tests/data/gpu_h200/real_size_top_level_ops.json, written there by its GPU side)."""
    data = json.loads(REAL_SIZE.read_text())
    assert all(scan["rc"] == 0 and scan["whole"] for scan in data["scans"].values())
    return {name: {phase: set(names) for phase, names in scan["phases"].items()}
            for name, scan in data["scans"].items()}


def _same_as_the_gpu(gpu: dict, mine: dict) -> None:
    """Every top-level training operator the GPU ran, and no other, and the same optimizer kernels."""
    assert _optimizer_kernels(mine) == _optimizer_kernels(gpu)
    data = gpu.get("other", set()) | mine.get("other", set())
    theirs, ours = parity.training_ops(gpu, data), parity.training_ops(mine, data)
    assert _jaccard(theirs, ours) >= 0.95 and theirs == ours, (sorted(theirs - ours), sorted(ours - theirs))


def test_cnn_records_the_gpus_operators(h200, cnn_scan):
    """The bundled CNN (AMP, cuDNN batch norm on the GPU): the same operators as on the H200, SGD as foreach."""
    mine = _top_level(cnn_scan)
    assert _optimizer_kernels(mine) == {"aten::_foreach_add", "aten::_foreach_add_", "aten::_foreach_mul_"}
    _same_as_the_gpu(h200["cnn"], mine)


def test_cnn_reproduces_the_shared_h200_scan(gpu, cnn_scan):
    """Against ../shared's older H200 scan of the CNN: the same operators but one.  That scan was made before
    cuDNN's batch-norm backward was recorded (a backend kernel with no public parent, then folded away), so it
    has no batch-norm backward at the top level; the stand-in's native_batch_norm_backward is one, as is the
    cudnn_batch_norm_backward of the H200 scan made since (test_cnn_records_the_gpus_operators)."""
    mine = _top_level(cnn_scan)
    assert _optimizer_kernels(mine) == _optimizer_kernels(gpu["cnn"])
    data = gpu["cnn"].get("other", set()) | mine.get("other", set())
    theirs, ours = _training_ops(gpu["cnn"], "cnn", data), _training_ops(mine, "cnn", data)
    assert ours - theirs == {"aten::native_batch_norm_backward"} and not theirs - ours
    assert _jaccard(theirs, ours) >= 0.95


def test_nanogpt_records_the_gpus_operators(gpu, h200, tmp_path):
    """nanoGPT's small GPT (SDPA, fused AdamW) as bench/gpu_parity.py runs it on the H200, and against
    karpathy/nanoGPT's GPT-2 small there."""
    proc = run_opscope("scan", SCRIPTS / "frameworks" / "nanogpt_train.py", "--steps", "3", "--out", tmp_path,
                       "--quiet", "--format", "", "--", "--max_iters=10", "--compile=False", cwd=tmp_path,
                       timeout=600)
    assert (tmp_path / "capture" / "steps.jsonl").exists(), proc.stderr[-3000:]
    mine = _top_level(tmp_path)
    _same_as_the_gpu(h200["nanogpt"], mine)
    # nanoGPT asks AdamW for fused=True when device_type == 'cuda': the stand-in passes it on, and torch's
    # fused AdamW runs on the CPU too
    assert _optimizer_kernels(mine) == _optimizer_kernels(gpu["gpt2"]) and "aten::_fused_adamw_" in _optimizer_kernels(mine)
    data = gpu["gpt2"].get("other", set()) | mine.get("other", set())
    theirs, ours = _training_ops(gpu["gpt2"], "gpt2", data), _training_ops(mine, "gpt2", data)
    assert _jaccard(theirs, ours) >= 0.95, (sorted(theirs - ours), sorted(ours - theirs))


def test_optimizers_default_to_foreach_for_the_gpus_parameters():
    """SGD/Adam/AdamW without foreach=/fused= take torch's CUDA default (foreach) on parameters the script
    put on the GPU; CPU tensors the script keeps on the CPU still take the CPU's (the loop)."""
    import torch

    from opscope.capture.remap import CudaRemapper, RuntimeFindings
    from opscope.capture.source import UserCode
    from torch.optim import optimizer as optim_base

    remapper = CudaRemapper(RuntimeFindings(UserCode(None)))
    remapper._install_optimizers()
    try:
        on_gpu, on_cpu = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
        on_gpu._opscope_dev = True
        assert optim_base._default_to_fused_or_foreach([on_gpu], False) == (False, True)
        assert optim_base._default_to_fused_or_foreach([on_cpu], False) == (False, False)
        from torch.optim import adam
        assert adam._default_to_fused_or_foreach is optim_base._default_to_fused_or_foreach
    finally:
        remapper.uninstall()
    assert optim_base._default_to_fused_or_foreach([on_gpu], False) == (False, False)
