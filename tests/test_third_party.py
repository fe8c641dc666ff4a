"""Third-party operators judged by Ascend's own answers (issue 32, torchvision first).

``support_matrix/third_party.yaml`` holds, with sources, which adapter package registers NPU kernels for a
library's dispatcher ops (torchvision_npu for torchvision's nms/roi_align/roi_pool) and which release
pairs with each torch_npu; with no paired release, torch_npu's CPU fallback is the answer.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, SCRIPTS, has_cuda, load_scan
from opscope.analysis.third_party import adapter_release, judge_third_party
from opscope.knowledge import load

LOOP = SCRIPTS / "third_party" / "roi_heads_loop.py"
TV_SHIM = SCRIPTS / "frameworks" / "tv_shim"
ADAPTER_OPS = ("nms", "roi_align", "_roi_align_backward", "roi_pool", "_roi_pool_backward", "deform_conv2d")


@pytest.mark.parametrize("op", ADAPTER_OPS)
def test_torchvision_ops_need_the_adapter_paired_with_the_target(op):
    judged = judge_third_party(f"torchvision::{op}", "2.6.0")
    assert judged.verdict == "adapter"
    assert judged.evidence["install"] == "torchvision_npu v0.21.0-7.1.0"
    assert judged.evidence["paired"] == "Ascend's table pairs it with torch_npu 2.6.0"
    assert judged.evidence["source"].startswith("Ascend/vision@db96db76 torchvision_npu/")
    assert "fall back to run on the CPU" in judged.evidence["without"]


def test_a_post_release_takes_the_newest_tag_of_its_torch():
    judged = judge_third_party("torchvision::roi_align", "2.1.0.post17")
    assert judged.verdict == "adapter" and judged.evidence["install"] == "torchvision_npu v0.16.0-7.1.0"
    assert "newest paired release of the torch 2.1.0" in judged.evidence["paired"]
    assert judged.evidence["adapter_release"]["cann"] == "8.2.RC1"


@pytest.mark.parametrize("target", ["2.8.0.post5", "2.14.0", "2.15"])
def test_without_an_adapter_release_the_op_falls_back_to_the_cpu(target):
    judged = judge_third_party("torchvision::nms", target)
    assert judged.verdict == "cpu-fallback" and judged.evidence["rule"] == "third-party-no-adapter-release"
    assert judged.evidence["detail"].startswith(f"torchvision_npu has no release for torch_npu {target} "
                                                "(its releases pair with torch_npu 2.1.0.post6, ")
    assert "install" not in judged.evidence


def test_ops_the_adapter_does_not_cover_and_unknown_libraries():
    assert judge_third_party("torchvision::ps_roi_align", "2.6.0").verdict == "cpu-fallback"
    other = judge_third_party("torchvision::some_new_op", "2.6.0")
    assert other.verdict == "cpu-fallback" and other.evidence["rule"] == "third-party-default"
    assert judge_third_party("torchaudio::lfilter", "2.6.0").verdict == "cpu-fallback"
    assert judge_third_party("mylab::fused_thing", "2.6.0") is None   # stays `unknown` in verdicts.py
    flash = judge_third_party("flash_attn::_flash_attn_forward", "2.6.0")
    assert flash.verdict == "unsupported" and "torch_npu.npu_fusion_attention" in flash.evidence["detail"]
    assert flash.evidence["without_source"].startswith("huggingface/transformers@5.24.0 src/transformers/")


def test_every_answer_names_its_source():
    data = load("third_party.yaml")
    for name, library in data["libraries"].items():
        for op, entry in (library.get("ops") or {}).items():
            assert entry["source"] in data["sources"] and entry.get("at"), (name, op)
            assert entry["verdict"] in ("adapter", "cpu-fallback", "unsupported"), (name, op)
        adapter = library.get("adapter")
        if adapter:
            assert adapter["source"] in data["sources"] and adapter["releases"]
            release, _ = adapter_release(adapter, adapter["releases"][0]["torch_npu"])
            assert release == adapter["releases"][0]


def _scan(out, target: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TV_SHIM), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(LOOP), "--steps", "3", "--target", target,
                           "--out", str(out), "--format", "md", "-q"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_scan(out)


def _torchvision_ops(data: dict) -> dict:
    return {op["name"]: op for op in data["operators"] if op["name"].startswith("torchvision::")
            and op["verdict"] != "not-applicable"}


def _torchvision_kernels() -> bool:
    """torchvision's C++ ops load here (the CUDA build's torchvision next to its torch; .ci/run's second venv).
    This index's torchvision next to the CPU wheel has none: opscope.fleet.tv_compat shims nms alone."""
    import importlib.util
    if importlib.util.find_spec("torchvision") is None:
        return False
    from opscope.fleet import tv_compat
    tv_compat.import_torchvision()
    return not tv_compat.SHIMMED


@pytest.mark.skipif(has_cuda(), reason="the loop's CUDA calls are stood in only without a GPU")
@pytest.mark.skipif(not _torchvision_kernels(), reason="torchvision's C++ ops do not load next to this torch")
def test_a_detection_head_loop_at_two_targets(tmp_path):
    paired, newest = _scan(tmp_path / "paired", "2.6.0"), _scan(tmp_path / "newest", "2.14.0")
    ops = _torchvision_ops(paired)
    assert "torchvision::nms" in ops
    assert {op["verdict"] for op in ops.values()} == {"adapter"}
    assert {op["evidence"]["install"] for op in ops.values()} == {"torchvision_npu v0.21.0-7.1.0"}
    assert {"torchvision::roi_align", "torchvision::_roi_align_backward", "torchvision::roi_pool",
            "torchvision::_roi_pool_backward"} <= set(ops)
    assert {op["verdict"] for op in _torchvision_ops(newest).values()} == {"cpu-fallback"}
    assert set(_torchvision_ops(newest)) == set(ops)
    report = (tmp_path / "paired" / "report.md").read_text()
    assert "install torchvision_npu v0.21.0-7.1.0 for " in report and "| adapter |" in report
