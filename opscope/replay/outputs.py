"""An op's result as a flat list of tensors: what ``run`` judges and ``substitutes`` compares."""
from __future__ import annotations


def flatten_outputs(value) -> list:
    """Tensors of an op's result in order (nested tuples/lists flattened; None kept)."""
    import torch
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(flatten_outputs(v))
        return out
    if isinstance(value, torch.Tensor) or value is None:
        return [value]
    if isinstance(value, (bool, int, float)):
        return [torch.tensor(value)]
    return [None]
