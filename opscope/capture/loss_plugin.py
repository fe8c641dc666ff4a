"""Child-side plugin of `opscope verify --e2e`: seed everything, record the loss per step.

Loaded by the capture child (``plugins=["opscope.capture.loss_plugin:install"]``) before
the user's script starts.  The loss is the root tensor of each ``backward()`` call (the
unscaled value when a GradScaler scaled it); the gradient norm is taken over the
parameters of every optimizer the script built, when a step ends (after
``optimizer.step()``, before the next ``zero_grad()``).  After each step everything is
written to ``<out_dir>/e2e_losses.json`` so a crash still leaves the steps done so far.
"""
from __future__ import annotations

import json
import math
import os
import random
import weakref
from pathlib import Path

from opscope.atomic import write_atomic

SEED_ENV = "OPSCOPE_E2E_SEED"
FILE_NAME = "e2e_losses.json"


def seed_everything(seed: int) -> None:
    """Same seed for Python, NumPy and torch (all devices); deterministic kernels where possible."""
    import torch
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


class LossRecorder:
    """Remembers backward() roots and per-step gradient norms; writes them after each step."""

    def __init__(self, path: Path, device: str, seed: int):
        self.path = Path(path)
        self.device = device
        self.seed = seed
        self.pending: list[float] = []
        self.losses: list = []
        self.grad_norms: list = []
        self.backward_calls: list[int] = []
        self.optimizers: list = []
        self.unscaled: dict[int, float] = {}

    # -- patches ---------------------------------------------------------
    def patch(self) -> None:
        import torch
        recorder = self
        original_backward = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            root = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
            if isinstance(root, torch.Tensor) and root.numel() == 1:
                value = recorder.unscaled.pop(id(root), None)
                recorder.pending.append(value if value is not None else float(root.detach().float()))
            return original_backward(tensors, *args, **kwargs)

        torch.autograd.backward = backward

        original_init = torch.optim.Optimizer.__init__

        def init(opt, *args, **kwargs):
            original_init(opt, *args, **kwargs)
            recorder.optimizers.append(weakref.ref(opt))

        torch.optim.Optimizer.__init__ = init   # type: ignore[method-assign,assignment]

        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is not None:
            original_scale = scaler_cls.scale

            def scale(scaler, outputs):
                scaled = original_scale(scaler, outputs)
                if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and outputs.numel() == 1:
                    recorder.unscaled[id(scaled)] = float(outputs.detach().float())
                return scaled

            scaler_cls.scale = scale

    # -- per step ---------------------------------------------------------
    def grad_norm(self) -> float | None:
        total, seen = 0.0, False
        for ref in self.optimizers:
            opt = ref()
            if opt is None:
                continue
            for group in opt.param_groups:
                for p in group["params"]:
                    if getattr(p, "grad", None) is not None:
                        total += float(p.grad.detach().float().norm()) ** 2
                        seen = True
        return math.sqrt(total) if seen else None

    def end_step(self, step_index: int) -> None:
        loss = sum(self.pending) / len(self.pending) if self.pending else None
        self.losses.append(loss)
        self.backward_calls.append(len(self.pending))
        self.grad_norms.append(self.grad_norm())
        self.pending = []
        self.unscaled.clear()
        self.write()

    def write(self) -> None:
        data = {"device": self.device, "seed": self.seed, "loss": self.losses, "grad_norm": self.grad_norms,
                "backward_calls": self.backward_calls,
                "loss_is": "mean of the backward() root values in the step (unscaled by GradScaler)"}
        write_atomic(self.path, json.dumps(data))


def install(ctx) -> None:
    """Plugin entry: called in the child before the script runs."""
    seed = int(os.environ.get(SEED_ENV, "0"))
    seed_everything(seed)
    recorder = LossRecorder(Path(ctx.out_dir) / FILE_NAME, ctx.device, seed)
    recorder.patch()
    ctx.on_step(recorder.end_step)
