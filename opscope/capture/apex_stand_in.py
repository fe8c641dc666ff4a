"""NVIDIA apex's Python API on the CPU, for a scan of a script written for it (apex is not on PyPI).

The porting guides' mixed-precision recipe is apex's: ``model, optimizer = amp.initialize(model, optimizer,
opt_level="O2", loss_scale=128.0)``, ``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``,
``apex.optimizers.FusedAdam``.  This stand-in does what each opt level does to the program -- O1 runs the
forward under float16 autocast; O2 casts the model to float16 (batch norm kept in float32), casts its inputs,
and steps float32 master weights; O3 is pure float16 -- with static or dynamic loss scaling and overflow
skipping, and the fused optimizers as torch's (foreach) ones.  Its own work runs inside profiler ranges named
``apex::<API>`` so that ``support_matrix/third_party.yaml`` judges apex's calls: the ATen operators inside a
range are how the stand-in computes them, not what runs on the NPU.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.autograd.profiler import record_function

STAND_IN_VERSION = "0.1+opscope.stand-in"
_PRECISION: dict = {}   # what the script asked for, for the session's precision check (``bind``)


def bind(precision: dict) -> None:
    """Report the precision amp.initialize asks for into the session's record (``RuntimeFindings.precision``)."""
    global _PRECISION
    _PRECISION = precision


class _Amp:
    """The state amp.initialize sets up: opt level, loss scale, master weights."""

    def __init__(self):
        self.opt_level = None
        self.scale = 1.0
        self.dynamic = False
        self.good_steps = 0
        self.masters: dict = {}   # id(optimizer) -> [(model param, master param)]
        self.skip: set = set()    # optimizers whose next step is skipped (overflow)


_AMP = _Amp()
# opt level -> (what happens to the model, float32 master weights, default loss scale)
_LEVELS: dict[str, tuple[str | None, bool, float | str]] = {
    "O0": (None, False, 1.0), "O1": ("autocast", False, "dynamic"), "O2": ("half", True, "dynamic"),
    "O3": ("half", False, 1.0)}


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _request(what: str, value: str) -> None:
    seen = _PRECISION.setdefault(what, [])
    if value not in seen:
        seen.append(value)


def _autocast_forward(model):
    forward = model.forward

    @functools.wraps(forward)
    def run(*args, **kwargs):
        with torch.autocast("cpu", dtype=torch.float16):
            return forward(*args, **kwargs)
    model.forward = run


def _half_model(model, keep_batchnorm_fp32: bool):
    model.half()
    if keep_batchnorm_fp32:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.float()
    forward = model.forward

    def cast(value, dtype):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v, dtype) for v in value)
        if isinstance(value, dict):
            return {k: cast(v, dtype) for k, v in value.items()}
        return value

    @functools.wraps(forward)
    def run(*args, **kwargs):   # apex O2 casts the inputs to float16 and the outputs back to float32
        return cast(forward(*cast(args, torch.float16), **cast(kwargs, torch.float16)), torch.float32)
    model.forward = run


def _master_weights(optimizer):
    pairs = []
    for group in optimizer.param_groups:
        masters = []
        for param in group["params"]:
            master = param.detach().float().clone().requires_grad_(True)
            pairs.append((param, master))
            masters.append(master)
        group["params"] = masters
    _AMP.masters[id(optimizer)] = pairs


def _wrap_step(optimizer):
    step = optimizer.step

    @functools.wraps(step)
    def amp_step(*args, **kwargs):
        if id(optimizer) in _AMP.skip:   # overflow in this iteration's gradients: apex skips the step
            _AMP.skip.discard(id(optimizer))
            return None
        out = step(*args, **kwargs)
        pairs = _AMP.masters.get(id(optimizer))
        if pairs:
            with record_function("apex::amp.master_params_to_model"), torch.no_grad():
                for param, master in pairs:
                    param.copy_(master)
        return out
    optimizer.step = amp_step
    zero_grad = optimizer.zero_grad

    @functools.wraps(zero_grad)
    def amp_zero_grad(*args, **kwargs):   # the model's float16 gradients too, not only the masters'
        zero_grad(*args, **kwargs)
        for param, _master in _AMP.masters.get(id(optimizer)) or []:
            param.grad = None
    optimizer.zero_grad = amp_zero_grad


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None, loss_scale=None,
               **kwargs):
    """``apex.amp.initialize``: returns the models and optimizers as given (one or a list of each)."""
    if not enabled:
        return models if optimizers is None else (models, optimizers)
    if opt_level not in _LEVELS:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', 'O3'.")
    cast, masters, default_scale = _LEVELS[opt_level]
    _AMP.opt_level = opt_level
    scale = default_scale if loss_scale is None else loss_scale
    _AMP.dynamic = scale == "dynamic"
    _AMP.scale = 2.0 ** 16 if _AMP.dynamic else float(scale)   # type: ignore[arg-type]
    if cast:   # apex scales the loss itself (no GradScaler work to look for)
        _request("autocast", "float16")
    for model in _as_list(models):
        if cast == "autocast":
            _autocast_forward(model)
        elif cast == "half":
            _half_model(model, keep_batchnorm_fp32 if keep_batchnorm_fp32 is not None else opt_level == "O2")
    for optimizer in _as_list(optimizers) if optimizers is not None else []:
        if masters if master_weights is None else master_weights:
            _master_weights(optimizer)
        _wrap_step(optimizer)
    return models if optimizers is None else (models, optimizers)


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    """``apex.amp.scale_loss``: yields the scaled loss; on exit unscales the gradients (into the master
    weights under O2) and skips the step and lowers the scale when they overflowed."""
    with record_function("apex::amp.scale_loss"):
        scaled = loss.float() * _AMP.scale
    yield scaled
    if delay_unscale:
        return
    with record_function("apex::amp.unscale"), torch.no_grad():
        overflow = False
        for optimizer in _as_list(optimizers):
            pairs = _AMP.masters.get(id(optimizer)) or [(p, p) for g in optimizer.param_groups for p in g["params"]]
            for param, master in pairs:
                if param.grad is None:
                    continue
                grad = param.grad.float() / _AMP.scale
                overflow = overflow or not bool(torch.isfinite(grad).all())
                if master is param:
                    param.grad.copy_(grad)
                else:
                    master.grad = grad
        _update_scale(overflow, optimizers)


def _update_scale(overflow: bool, optimizers) -> None:
    if not _AMP.dynamic:
        return
    if overflow:
        _AMP.scale /= 2.0
        _AMP.good_steps = 0
        _AMP.skip.update(id(o) for o in _as_list(optimizers))
    else:
        _AMP.good_steps += 1
        if _AMP.good_steps % 2000 == 0:
            _AMP.scale *= 2.0


def master_params(optimizer):
    """``apex.amp.master_params``: the parameters the optimizer steps (the float32 masters under O2)."""
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None):
    return {"loss_scaler0": {"loss_scale": _AMP.scale, "unskipped": _AMP.good_steps}}


def load_state_dict(state):
    scaler = (state or {}).get("loss_scaler0") or {}
    _AMP.scale = float(scaler.get("loss_scale", _AMP.scale))
    _AMP.good_steps = int(scaler.get("unskipped", 0))


class FusedAdam(torch.optim.AdamW):
    """``apex.optimizers.FusedAdam`` (adam_w_mode=True: AdamW; False: Adam's L2 weight decay) as torch's."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, **kwargs):
        self._l2 = 0.0 if adam_w_mode else weight_decay
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay if adam_w_mode else 0.0,
                         amsgrad=amsgrad, foreach=True)

    def step(self, closure=None):
        with record_function("apex::optimizers.FusedAdam.step"):
            if self._l2:
                with torch.no_grad():
                    for group in self.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.grad.add_(p, alpha=self._l2)
            return super().step(closure)


class FusedSGD(torch.optim.SGD):
    """``apex.optimizers.FusedSGD`` as torch's SGD (foreach)."""

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **kwargs):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, foreach=True)

    def step(self, closure=None):
        with record_function("apex::optimizers.FusedSGD.step"):
            return super().step(closure)


class FusedLayerNorm(torch.nn.LayerNorm):
    """``apex.normalization.FusedLayerNorm`` as torch's LayerNorm."""

    def forward(self, input):
        with record_function("apex::normalization.FusedLayerNorm"):
            return super().forward(input)


API = {"apex.amp": (initialize, scale_loss, master_params, state_dict, load_state_dict),
       "apex.optimizers": (FusedAdam, FusedSGD), "apex.normalization": (FusedLayerNorm,)}
