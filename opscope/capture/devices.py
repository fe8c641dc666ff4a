"""Device arguments as a script writes them (``"cuda:0"``, ``torch.device("cuda")``, a local rank).

Below both halves of the CUDA->CPU remap: ``remap.py`` (tensors, ``torch.cuda``) and
``remap_dist.py`` (process groups).
"""
from __future__ import annotations

import torch


def is_cuda(dev) -> bool:
    """Whether ``dev`` names a CUDA device (an int is a CUDA ordinal, as in ``.to(rank)``)."""
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.split(":")[0] == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)   # .to(rank), device=local_rank: cuda:N
