"""Devices: which one a scan runs on (``resolve_device``), and device arguments as a script writes
them (``"cuda:0"``, ``torch.device("cuda")``, a local rank).

Below the capture child (which resolves ``--device auto``), the in-process API, recovery, and
both halves of the CUDA->CPU remap: ``remap.py`` (tensors, ``torch.cuda``) and ``remap_dist.py``
(process groups).
"""
from __future__ import annotations

import importlib.util

import torch

from opscope.errors import UserError


def resolve_device(requested: str) -> str:
    """auto -> npu if torch_npu and a device are present, else cuda if available, else cpu."""
    requested = (requested or "auto").lower()
    if requested not in ("auto", "cpu", "cuda", "npu"):
        raise UserError(f"unknown --device {requested!r}: use auto, cpu, cuda or npu")
    npu_ok = _npu_available()
    cuda_ok = torch.cuda.is_available()
    if requested == "auto":
        return "npu" if npu_ok else ("cuda" if cuda_ok else "cpu")
    if requested == "cuda" and not cuda_ok:
        raise UserError("--device cuda: no CUDA device is available here; use --device cpu "
                        "(CUDA calls are then remapped to the CPU) or run on a GPU machine")
    if requested == "npu" and not npu_ok:
        raise UserError("--device npu: torch_npu is not importable or no NPU is present; "
                        "install torch_npu with CANN on an Ascend machine, or use --device cpu")
    return requested


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:  # pragma: no cover - needs Ascend hardware
        import torch_npu  # noqa: F401
        return bool(torch.npu.is_available())   # type: ignore[attr-defined]
    except Exception:
        return False


def is_cuda(dev) -> bool:
    """Whether ``dev`` names a CUDA device (an int is a CUDA ordinal, as in ``.to(rank)``)."""
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.split(":")[0] == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)   # .to(rank), device=local_rank: cuda:N
