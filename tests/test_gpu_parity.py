"""The stand-in records what a real GPU runs (issue 41): the top-level training operators and the optimizer's
kernels of the bundled CNN and of nanoGPT match those of the same scripts scanned on an NVIDIA H200
(tests/data/gpu_h200/top_level_ops.json, from ../shared/data/gpu_h200_torch2.11)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, run_opscope

DATA = Path(__file__).resolve().parent / "data" / "gpu_h200" / "top_level_ops.json"
TRAINING = ("forward", "backward", "optimizer")
# one public op for each backend's own kernel of it: the GPU runs cuDNN's SDPA, the CPU its flash kernel
BACKEND_KERNELS = {
    "aten::_scaled_dot_product_cudnn_attention": "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention": "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_efficient_attention": "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_cudnn_attention_backward": "aten::scaled_dot_product_attention_backward",
    "aten::_scaled_dot_product_flash_attention_backward": "aten::scaled_dot_product_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward": "aten::scaled_dot_product_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "aten::scaled_dot_product_attention_backward",
}
# what the scripts differ in, not the stand-in: the GPU ran karpathy/nanoGPT, whose blocks call nn.Dropout
# (p=0.0 still records aten::dropout); tests/data/scripts/frameworks/nanogpt_train.py has no Dropout module
SCRIPT_ONLY = {"gpt2": {"aten::dropout"}}


def _top_level(steps_log: Path, steps=(2, 3)) -> dict[str, set[str]]:
    from opscope.capture.run_folder import CALL_FIELDS
    parent, phase, name = (CALL_FIELDS.index(f) for f in ("parent", "phase", "name"))
    out: dict[str, set[str]] = {}
    for line in steps_log.read_text().splitlines():
        record = json.loads(line)
        if record["step"] in steps:
            for call in record["calls"]:
                if call[parent] is None:
                    out.setdefault(call[phase], set()).add(call[name])
    return out


def _training_ops(phases: dict, scan: str, data: set[str]) -> set[str]:
    """Top-level operators of the training phases, backend kernels as their public op, the host's data
    work left out (``data``: the ops either scan ran in its data phase, ``other``: stack, pin_memory, to;
    the GPU's scan puts the batch's copy to the device there, the stand-in its no-op copy in the forward)."""
    names = {n for phase in TRAINING for n in phases.get(phase, ())} - data - SCRIPT_ONLY.get(scan, set())
    return {BACKEND_KERNELS.get(n, n) for n in names}


def _optimizer_kernels(phases: dict) -> set[str]:
    return {n for n in phases.get("optimizer", ()) if n.startswith(("aten::_foreach_", "aten::_fused_"))}


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


@pytest.fixture(scope="module")
def gpu() -> dict:
    return {scan: {phase: set(names) for phase, names in phases.items()}
            for scan, phases in json.loads(DATA.read_text())["scans"].items()}


def test_cnn_records_the_gpus_operators(gpu, cnn_scan):
    mine = _top_level(cnn_scan / "capture" / "steps.jsonl")
    assert _optimizer_kernels(mine) == _optimizer_kernels(gpu["cnn"]) == {
        "aten::_foreach_add", "aten::_foreach_add_", "aten::_foreach_mul_"}   # SGD with momentum: foreach
    data = gpu["cnn"].get("other", set()) | mine.get("other", set())
    theirs, ours = _training_ops(gpu["cnn"], "cnn", data), _training_ops(mine, "cnn", data)
    # left: the GPU's cudnn_batch_norm_backward is a backend kernel folded into no public parent, so its
    # scan has no batch-norm backward at the top level; the stand-in's native_batch_norm_backward is one
    assert ours - theirs <= {"aten::native_batch_norm_backward"} and not theirs - ours
    assert _jaccard(theirs, ours) >= 0.95, (sorted(theirs - ours), sorted(ours - theirs))


def test_nanogpt_records_the_gpus_operators(gpu, tmp_path):
    proc = run_opscope("scan", SCRIPTS / "frameworks" / "nanogpt_train.py", "--steps", "3", "--out", tmp_path,
                       "--quiet", "--format", "", "--", "--max_iters=10", cwd=tmp_path, timeout=600)
    assert (tmp_path / "capture" / "steps.jsonl").exists(), proc.stderr[-3000:]
    mine = _top_level(tmp_path / "capture" / "steps.jsonl")
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
