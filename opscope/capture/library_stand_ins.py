"""GPU-only libraries that cannot be installed here, stood in so the script runs its GPU path.

``flash-attn`` has no wheel without CUDA, NVIDIA ``apex`` is not on PyPI at all (``apex_stand_in.py``), and
``xformers`` is often not installed on a CPU machine.  A script that imports it dies at import, and one that guards the
import (``try: from flash_attn import flash_attn_func`` / ``except ImportError:`` SDPA) is scanned on its
fallback path, not the program that runs on the GPU.  When the library is not installed, the scan serves
a module with the same Python API, computed with PyTorch's SDPA on the CPU, whose work is recorded under
the library's own operator names (``flash_attn::_flash_attn_forward`` / ``_flash_attn_backward``, as
flash-attn >= 2.6 registers them) so ``support_matrix/third_party.yaml`` judges it.  Importing it is a
run-time finding at the script's line (``library-stand-in``).  A library that is installed is never
stood in for, and only a scan that stands in for the GPU machine (the CUDA stand-in, ``remap.py``) stands in
for its libraries: on a real GPU or NPU the script imports what that machine has.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STAND_IN_VERSION = "2.8.3+opscope.stand-in"   # the flash-attn API the stand-in follows


def _heads_first(q, k, v):
    """flash-attn layout (batch, seqlen, heads, dim) -> (batch, heads, seqlen, dim), k/v heads repeated (GQA)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    repeat = qt.shape[1] // kt.shape[1]
    if repeat > 1:
        kt, vt = kt.repeat_interleave(repeat, dim=1), vt.repeat_interleave(repeat, dim=1)
    return qt, kt, vt, repeat


def _causal_mask(sq: int, sk: int, device):
    """flash-attn aligns the causal mask to the bottom right when seqlen_q != seqlen_k (SDPA: top left)."""
    import torch
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(sk - sq)


def _attention(q, k, v, softmax_scale: float, causal: bool):
    import torch.nn.functional as F
    qt, kt, vt, _ = _heads_first(q, k, v)
    sq, sk = qt.shape[-2], kt.shape[-2]
    mask = _causal_mask(sq, sk, q.device) if causal and sq != sk else None
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=causal and mask is None,
                                         scale=softmax_scale)
    return out.transpose(1, 2).contiguous()


def _attention_backward(dout, q, k, v, softmax_scale: float, causal: bool):
    """dq, dk, dv of softmax(scale * q k^T) v, written out (a custom op's kernel runs below autograd)."""
    import torch
    acc = torch.promote_types(q.dtype, torch.float32)   # fp16/bf16 accumulate in fp32, as flash-attn does
    qt, kt, vt, repeat = _heads_first(q.to(acc), k.to(acc), v.to(acc))
    do = dout.to(acc).transpose(1, 2)
    scores = softmax_scale * qt @ kt.transpose(-1, -2)
    if causal:
        scores = scores.masked_fill(~_causal_mask(scores.shape[-2], scores.shape[-1], scores.device), float("-inf"))
    p = scores.softmax(-1)
    dv = p.transpose(-1, -2) @ do
    dp = do @ vt.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    dq = softmax_scale * ds @ kt
    dk = softmax_scale * ds.transpose(-1, -2) @ qt
    if repeat > 1:   # each k/v head served `repeat` query heads: their gradients add up
        b, h, s, d = dk.shape
        dk = dk.view(b, h // repeat, repeat, s, d).sum(2)
        dv = dv.view(b, h // repeat, repeat, s, d).sum(2)
    return [g.transpose(1, 2).to(t.dtype).contiguous() for g, t in ((dq, q), (dk, k), (dv, v))]


_OPS: dict = {}


def _sdpa_ops(forward_name: str, backward_name: str):
    """Custom ops ``forward_name`` / ``backward_name`` (CPU: SDPA and its written-out backward), with autograd:
    a library's attention kernel recorded under the library's own op names."""
    if forward_name in _OPS:
        return _OPS[forward_name]
    import torch
    from torch.library import custom_op

    args = "Tensor q, Tensor k, Tensor v, float dropout_p, float softmax_scale, bool causal"

    @custom_op(forward_name, mutates_args=(), device_types="cpu", schema=f"({args}) -> Tensor")
    def forward(q, k, v, dropout_p, softmax_scale, causal):
        return _attention(q, k, v, softmax_scale, causal)   # attention dropout is not applied (stand-in)

    @custom_op(backward_name, mutates_args=(), device_types="cpu", schema=f"(Tensor dout, {args}) -> Tensor[]")
    def backward(dout, q, k, v, dropout_p, softmax_scale, causal):
        return _attention_backward(dout, q, k, v, softmax_scale, causal)

    def setup_context(ctx, inputs, output):
        q, k, v, dropout_p, softmax_scale, causal = inputs
        ctx.save_for_backward(q, k, v)
        ctx.args = (dropout_p, softmax_scale, causal)

    def grad(ctx, dout):
        q, k, v = ctx.saved_tensors
        dq, dk, dv = backward(dout.contiguous(), q, k, v, *ctx.args)
        return dq, dk, dv, None, None, None

    forward.register_autograd(grad, setup_context=setup_context)
    forward.register_fake(lambda q, k, v, *args: torch.empty_like(q))   # --mode fake: shapes only
    backward.register_fake(lambda dout, q, k, v, *args: [torch.empty_like(q), torch.empty_like(k),
                                                         torch.empty_like(v)])
    _OPS[forward_name] = forward
    return forward


def _flash_ops():
    """``flash_attn::_flash_attn_forward`` and ``_flash_attn_backward``, as flash-attn >= 2.6 registers them."""
    return _sdpa_ops("flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward")


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_func`` (q, k, v: batch x seqlen x heads x dim), run with SDPA."""
    if tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("opscope's flash-attn stand-in runs flash_attn_func without window_size, "
                                  "softcap, alibi_slopes or return_attn_probs; scan on a GPU with flash-attn "
                                  "installed for those")
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    return _flash_ops()(q, k, v, float(dropout_p), scale, bool(causal))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    """``qkv``: batch x seqlen x 3 x heads x dim."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, **kwargs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    """``kv``: batch x seqlen x 2 x heads x dim."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, **kwargs)


def _flash_attn_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "opscope's CPU stand-in for flash-attn (not installed here): SDPA")
    for api in (flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func):
        setattr(module, api.__name__, api)
    module.__version__ = STAND_IN_VERSION   # type: ignore[attr-defined]
    return module


class LowerTriangularMask:
    """xformers' causal mask (``xformers.ops.LowerTriangularMask()``), as an attention bias."""


def memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None, output_dtype=None):
    """xformers' ``memory_efficient_attention`` (query, key, value: batch x seqlen x heads x dim), run with SDPA.

    Recorded as ``xformers::efficient_attention_forward`` / ``_backward``: xformers has no NPU path, and
    ``support_matrix/third_party.yaml`` says what replaces it (``torch_npu.npu_fusion_attention``)."""
    causal = isinstance(attn_bias, LowerTriangularMask)
    if attn_bias is not None and not causal:
        raise NotImplementedError("opscope's xformers stand-in runs memory_efficient_attention with no bias or a "
                                  "LowerTriangularMask; scan on a GPU with xformers installed for other biases")
    scale = float(scale) if scale is not None else query.shape[-1] ** -0.5
    ops = _sdpa_ops("xformers::efficient_attention_forward", "xformers::efficient_attention_backward")
    out = ops(query, key, value, float(p), scale, causal)
    return out.to(output_dtype) if output_dtype is not None else out


def _xformers_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "opscope's CPU stand-in for xformers (not installed here): SDPA")
    module.__version__ = "0.0.35+opscope.stand-in"   # type: ignore[attr-defined]
    if name in ("xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias"):
        module.memory_efficient_attention = memory_efficient_attention   # type: ignore[attr-defined]
        module.LowerTriangularMask = LowerTriangularMask   # type: ignore[attr-defined]
    return module


def _apex_module(name: str) -> types.ModuleType:
    from opscope.capture import apex_stand_in
    module = types.ModuleType(name, "opscope's CPU stand-in for NVIDIA apex (not installed here)")
    module.__version__ = apex_stand_in.STAND_IN_VERSION   # type: ignore[attr-defined]
    for api in apex_stand_in.API.get(name, ()):
        setattr(module, api.__name__, api)
    return module


# top-level package -> (its modules, builder)
_LIBRARIES = {"flash_attn": (("flash_attn", "flash_attn.flash_attn_interface"), _flash_attn_module),
              "apex": (("apex", "apex.amp", "apex.optimizers", "apex.normalization"), _apex_module),
              "xformers": (("xformers", "xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias"),
                           _xformers_module)}


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the stand-in modules of libraries that are not installed; records who imported them."""

    def __init__(self, libraries: dict, findings):
        self.libraries, self.findings = libraries, findings

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.libraries and fullname in self.libraries[top][0]:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=self._is_package(fullname))
        return None

    def _is_package(self, name: str) -> bool:
        return any(other.startswith(name + ".") for other in self.libraries[name.partition(".")[0]][0])

    def create_module(self, spec):
        top = spec.name.partition(".")[0]
        module = self.libraries[top][1](spec.name)
        if self._is_package(spec.name):
            module.__path__ = []   # type: ignore[attr-defined]   # a package: its submodules import too
        if spec.name != top:   # `import apex.amp` binds it on its package too
            parent, _, child = spec.name.rpartition(".")
            setattr(sys.modules[parent], child, module)
        return module

    def exec_module(self, module):
        if "." not in module.__name__:   # `from apex import amp`: a package's submodules exist as attributes
            for sub in self.libraries[module.__name__][0][1:]:
                importlib.import_module(sub)
        if self.findings is not None and "." not in module.__name__:
            # importlib's frames between here and the import statement are looked through to the script's line
            self.findings.record("library-stand-in", f"import {module.__name__} (stood in: not installed here)")


def install_library_stand_ins(findings) -> list:
    """Put the finder first on ``sys.meta_path`` for the libraries that are not installed; the undo handles."""
    missing = {top: spec for top, spec in _LIBRARIES.items()
               if top not in sys.modules and importlib.util.find_spec(top) is None}
    if not missing:
        return []
    if "apex" in missing and findings is not None:
        from opscope.capture import apex_stand_in
        apex_stand_in.bind(findings.precision)
    from opscope.capture.import_hooks import first_finder
    return first_finder(_StandInFinder(missing, findings))


class _MissingLibraryWatcher(importlib.abc.MetaPathFinder):
    """Where no stand-in is served (a real GPU or NPU scan): an import of a GPU-only library that is not
    installed fails as it would without opscope, and the line is reported (``library-fallback``): the script
    ran its fallback path, not the program that runs with the library."""

    def __init__(self, missing: set[str], findings):
        self.missing, self.findings = missing, findings
        self.seen: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.missing and top not in self.seen:
            self.seen.add(top)
            self.findings.record("library-fallback", f"import {top} (not installed: the script's fallback ran)",
                                 remapped=False)
        return None   # the import fails as it would: the script's except branch runs


def watch_missing_libraries(findings) -> list:
    """Report the guarded imports of GPU-only libraries that fail on a scan that does not stand in for them."""
    missing = {top for top in _LIBRARIES if top not in sys.modules and importlib.util.find_spec(top) is None}
    if not missing or findings is None:
        return []
    from opscope.capture.import_hooks import first_finder
    return first_finder(_MissingLibraryWatcher(missing, findings))

