"""Import torchvision even when its C++ extension cannot load.

PyPI's torchvision wheels are built against the CUDA build of torch; next to a CPU-only
torch (``torch==2.13.0+cpu``) their ``_C`` extension does not load, and torchvision 0.28
then fails at import (``operator torchvision::nms does not exist``).  Generated fleet jobs
call :func:`import_torchvision`, which in that case defines ``torchvision::nms`` /
``torchvision::qnms`` with a pure-PyTorch CPU kernel before importing torchvision again.
``roi_align`` then uses torchvision's own Python fallback.  The operators recorded for a
detection model are then ``torchvision::nms`` plus the ATen operators of RoIAlign's Python
implementation (what torchvision itself runs without its extension).
"""
from __future__ import annotations

import sys

_LIB = None
SHIMMED = False


def _nms_cpu(dets, scores, iou_threshold: float):
    import numpy as np
    import torch

    if dets.numel() == 0:
        return torch.empty((0,), dtype=torch.long, device=dets.device)
    order = torch.argsort(scores, descending=True)
    boxes = dets.index_select(0, order).detach().to("cpu", torch.float64).numpy()
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1).clip(min=0) * (y2 - y1).clip(min=0)
    keep = np.ones(len(boxes), dtype=bool)
    for i in range(len(boxes)):
        if not keep[i]:
            continue
        rest = slice(i + 1, None)
        w = (np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])).clip(min=0)
        h = (np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])).clip(min=0)
        inter = w * h
        iou = inter / np.maximum(areas[i] + areas[rest] - inter, 1e-12)
        keep[rest] &= iou <= iou_threshold
    return order[torch.from_numpy(keep).to(order.device)]


def import_torchvision():
    """``import torchvision``, defining its NMS operators first when its extension cannot load."""
    global _LIB, SHIMMED
    try:
        import torchvision
        return torchvision
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    import torch

    if _LIB is None:
        _LIB = torch.library.Library("torchvision", "DEF")
        _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.impl("nms", _nms_cpu, "CPU")
    import torchvision
    import torchvision.ops.boxes as boxes

    boxes._assert_has_ops = lambda: None   # nms now has a kernel; the other ops keep their check
    SHIMMED = True
    return torchvision
