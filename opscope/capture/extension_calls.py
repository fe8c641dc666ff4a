"""Calls into a library's compiled extension, made visible to the profiler.

mmcv's ``_ext``, apex's ``amp_C`` / ``fused_layer_norm_cuda`` and detectron2's ``_C`` are pybind modules, not
dispatcher ops: the profiler never sees them, so nothing would judge them, and on torch_npu they are exactly
what fails (no CPU fallback catches a pybind call).  When such a module is imported during a scan, each of its
functions is wrapped: the call runs inside a dispatcher op named ``<namespace>::<prefix><function>``
(``mmcv::roi_align_forward``) whose inputs are the call's tensors, so it is recorded like any operator, with
the tensors' shapes and dtypes, its phase and its line, and ``support_matrix/third_party.yaml`` judges it.
The work the extension does itself (ATen calls of its CPU kernel) is recorded below that op.

Which modules are extensions, and the namespace and prefix of their ops, are data: ``extensions:`` of each
library in ``third_party.yaml``.  Wrapping observes; it changes no result: the wrapped function is called with
the same arguments and its return value (or exception) is passed on.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

MAX_TENSORS = 32   # tensors of one call recorded as the op's inputs (a multi-tensor apply passes lists)

_local = threading.local()
_libraries: dict[str, Any] = {}   # namespace -> torch.library.Library (fragments opscope defines its ops in)
_defined: dict[tuple[str, str, int], str] = {}   # (namespace, name, tensors) -> overload ("" for the first)


def extension_modules() -> dict[str, tuple[str, str]]:
    """module name -> (op namespace, op-name prefix), from ``third_party.yaml``'s ``extensions:``."""
    from opscope.knowledge import load_optional
    found: dict[str, tuple[str, str]] = {}
    for library in (load_optional("third_party.yaml").get("libraries") or {}).values():
        namespace = library.get("namespace")
        namespace = namespace[0] if isinstance(namespace, list) else namespace
        for module, prefix in (library.get("extensions") or {}).items():
            found[module] = (namespace, prefix or "")
    return found


def _tensors(args, kwargs) -> list:
    import torch
    found: list = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, list | tuple):   # a multi-tensor apply: lists of tensor lists
                found += [t for t in item if isinstance(t, torch.Tensor)]
            elif isinstance(item, torch.Tensor):
                found.append(item)
    return found[:MAX_TENSORS]


def _run_pending(*_tensors) -> None:
    fn, args, kwargs = _local.call
    _local.result = fn(*args, **kwargs)


def _op(namespace: str, name: str, count: int):
    """The op ``namespace::name`` taking ``count`` optional tensors, defined once: the default overload for the
    first number of tensors seen (usually the only one), ``t<count>`` for another."""
    import torch
    key = (namespace, name, count)
    if key not in _defined:
        library = _libraries.get(namespace)
        if library is None:
            library = _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
        first = not any(k[:2] == key[:2] for k in _defined)
        overload = "" if first else f"t{count}"
        qualified = f"{name}.{overload}" if overload else name
        params = ", ".join(f"Tensor? t{i}" for i in range(count))
        library.define(f"{qualified}({params}) -> ()")
        library.impl(qualified, _run_pending, "CompositeExplicitAutograd")
        _defined[key] = overload
    return getattr(getattr(getattr(torch.ops, namespace), name), _defined[key] or "default")


def wrap(fn: Callable, namespace: str, name: str) -> Callable:
    """``fn`` run inside the recorded op ``namespace::name``; the same result or exception."""
    if getattr(fn, "__opscope_extension__", None):
        return fn

    def recorded(*args, **kwargs):
        if getattr(_local, "call", None) is not None:   # an extension calling an extension: record the outer
            return fn(*args, **kwargs)
        tensors = _tensors(args, kwargs)
        op = _op(namespace, name, len(tensors))
        _local.call, _local.result = (fn, args, kwargs), None
        try:
            op(*tensors)
            return _local.result
        finally:
            _local.call = _local.result = None
    recorded.__name__ = getattr(fn, "__name__", name)
    recorded.__doc__ = getattr(fn, "__doc__", None)
    recorded.__opscope_extension__ = fn   # type: ignore[attr-defined]
    return recorded


def wrap_module(module, namespace: str, prefix: str, restores: list | None = None) -> int:
    """Wrap every public function of an extension module in place (each original kept in ``restores``, to put
    back when the session ends); how many were wrapped."""
    from opscope.capture.patches import Restore
    count = 0
    for attr in list(vars(module)):
        value = getattr(module, attr)
        if attr.startswith("_") or isinstance(value, type) or not callable(value) \
                or getattr(value, "__opscope_extension__", None):
            continue
        if restores is not None:
            restores.append(Restore(module, attr, value))
        setattr(module, attr, wrap(value, namespace, prefix + attr))
        count += 1
    return count


def install_extension_recording() -> list:
    """Wrap the extension modules named in the data as they are imported (and any already imported)."""
    from functools import partial

    from opscope.capture.import_hooks import after_import
    from opscope.capture.patches import RestoreAll
    restores: list = []

    def wrap_all(module, namespace: str, prefix: str) -> None:
        wrap_module(module, namespace, prefix, restores)
    return [*after_import({name: partial(wrap_all, namespace=namespace, prefix=prefix)
                           for name, (namespace, prefix) in extension_modules().items()}), RestoreAll(restores)]
