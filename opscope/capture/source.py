"""Attribute every operator to the user's source line, and track where shapes come from.

The profiler alone cannot say which line of *the user's* code caused an operator
(its Python tracer only knows function definitions).  A ``TorchFunctionMode`` sees
every outermost torch call made from Python; for each one we find the first frame in
the user's code and wrap the call in a tiny profiler annotation ``opscope#<id>``.
Every ATen op recorded under that annotation belongs to that line.

The same hook tags output tensors with an *origin*: the user line that created the
data whose shape they carry (a DataLoader, a factory call, a data-dependent op such as
``nonzero``).  Dynamic-shape analysis follows origins to the 3-5 lines worth fixing
instead of listing hundreds of downstream operators.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

_RecordFunction = getattr(torch._C._profiler, "_RecordFunctionFast", None)

# Calls that never launch an operator: no annotation needed (keeps overhead low).
_NO_OP_FUNCS = frozenset({
    "__get__", "__set__", "size", "dim", "numel", "__len__", "__repr__", "__format__",
    "__hash__", "__bool__", "data_ptr", "element_size", "is_contiguous", "stride",
    "storage_offset", "has_names", "is_floating_point", "is_complex", "get_device",
    "__iter__", "type", "__reduce_ex__", "__setstate__", "__deepcopy__", "untyped_storage",
    "requires_grad_", "register_hook", "_is_view", "is_leaf", "__dlpack__",
})


def _load_knowledge() -> dict:
    from opscope.knowledge import load
    return load("dynamic_shapes.yaml")


KNOWLEDGE = _load_knowledge()
# Python calls whose output shape depends on tensor *values* -> the ATen op they run.
PYTHON_TO_ATEN: dict = KNOWLEDGE["python_to_aten"]
_DATA_DEPENDENT = frozenset(k for k in PYTHON_TO_ATEN if k != "__getitem__")
# Calls that copy a device value to the host (a sync; sizes built from it vary).
_HOST_SYNC = frozenset({"item", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy"})

_LIB_DIRS = tuple({
    str(Path(p).resolve()) for p in (
        sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
        sysconfig.get_paths().get("platlib"), os.path.dirname(os.__file__),
    ) if p
}) + (str(Path(torch.__file__).resolve().parent.parent),)
_OPSCOPE_DIR = str(Path(__file__).resolve().parent.parent)


class SourceTable:
    """Interns (source, origin, cause, device|host) tuples so annotations stay short: ``opscope#17``."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.entries: list[tuple] = []

    def intern(self, triple: tuple) -> int:
        idx = self.ids.get(triple)
        if idx is None:
            idx = len(self.entries)
            self.ids[triple] = idx
            self.entries.append(triple)
        return idx


class UserCode:
    """Decides whether a file is the user's code (not stdlib, site-packages, torch, opscope)."""

    def __init__(self, root: str | None = None):
        self.root = str(Path(root).resolve()) if root else None
        self._cache: dict[str, str | None] = {}

    def display(self, filename: str) -> str | None:
        """Return the path to show for a user file, or None if it is library code."""
        hit = self._cache.get(filename, False)
        if hit is not False:
            return hit
        result = None
        if filename and not filename.startswith("<"):
            path = str(Path(filename).resolve())
            is_lib = path.startswith(_LIB_DIRS) or path.startswith(_OPSCOPE_DIR) or "site-packages" in path
            if not is_lib:
                if self.root and path.startswith(self.root + os.sep):
                    result = os.path.relpath(path, self.root)
                else:
                    result = path
        self._cache[filename] = result
        return result

    def frame_of(self, frame) -> tuple[str, int] | None:
        """First user frame at or above ``frame`` as (display path, line)."""
        while frame is not None:
            shown = self.display(frame.f_code.co_filename)
            if shown is not None:
                return shown, frame.f_lineno
            frame = frame.f_back
        return None


def _iter_tensors(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 2 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _iter_tensors(item, depth + 1)
    elif depth < 2 and isinstance(obj, dict):
        for item in obj.values():
            yield from _iter_tensors(item, depth + 1)


class Origin:
    """Where a tensor's shape came from; ``seq`` orders origins (newest wins)."""
    __slots__ = ("where", "cause", "seq")

    def __init__(self, where: str, cause: str, seq: int):
        self.where, self.cause, self.seq = where, cause, seq


class SourceTracker(TorchFunctionMode):
    """Annotate outermost torch calls with their user line; propagate shape origins.

    ``remapper`` (optional) rewrites CUDA device arguments when the scan runs on a
    machine without the script's device (see ``remap.py``).
    """

    def __init__(self, user_code: UserCode, table: SourceTable, remapper=None):
        super().__init__()
        self.user_code = user_code
        self.table = table
        self.remapper = remapper
        self.owner_pid = os.getpid()
        self.owner_thread = threading.get_ident()
        self.seq = 0
        self.host_values: dict[int, str] = {}                # int value read by .item() -> line
        self.data_dependent_outputs: dict[tuple, set] = {}   # (line, func) -> output shapes
        # Set by the session when a step ended inside an open profiler range (e.g. the
        # optimizer's post-hook): the profiler is only restarted at the next safe point,
        # the entry of an outermost torch call, never inside a record_function range.
        self.boundary_pending = False
        self.on_safe_point = None

    # -- helpers -----------------------------------------------------------------
    def _where(self) -> str | None:
        found = self.user_code.frame_of(sys._getframe(2))
        return f"{found[0]}:{found[1]}" if found else None

    def tag(self, obj, where: str, cause: str) -> None:
        """Mark tensors in ``obj`` as originating at ``where`` (used for DataLoader batches)."""
        self.seq += 1
        origin = Origin(where, cause, self.seq)
        for t in _iter_tensors(obj):
            try:
                t._opscope_origin = origin
            except Exception:
                pass

    def reset_step(self) -> dict:
        """Return and clear per-step side data (data-dependent output shapes)."""
        data = {
            "data_dependent_outputs": {f"{k[0]}|{k[1]}": sorted(v) for k, v in self.data_dependent_outputs.items()},
        }
        self.host_values.clear()
        self.data_dependent_outputs.clear()
        return data

    # -- the hook ----------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if os.getpid() != self.owner_pid:
            return func(*args, **kwargs)
        if getattr(func, "namespace", None) == "profiler":
            # record_function enter/exit: not a safe point (a range is still open) and
            # not the user's operator
            return func(*args, **kwargs)
        if self.boundary_pending and threading.get_ident() == self.owner_thread:
            self.on_safe_point()
        moved = False
        if self.remapper is not None:
            args, kwargs, handled, result = self.remapper.on_call(func, args, kwargs)
            moved = self.remapper.moved
            if handled:
                if moved and isinstance(result, torch.Tensor):
                    result._opscope_dev = True
                return result
        fname = getattr(func, "__name__", "")
        if fname in _NO_OP_FUNCS or threading.get_ident() != self.owner_thread:
            return func(*args, **kwargs)
        where = self._where()
        # origin: the newest origin among tensor inputs
        best = None
        on_device = moved or _is_accel(kwargs.get("device"))
        for t in _iter_tensors(args):
            o = getattr(t, "_opscope_origin", None)
            if o is not None and (best is None or o.seq > best.seq):
                best = o
            if not on_device and (t.device.type != "cpu" or getattr(t, "_opscope_dev", False)):
                on_device = True
        if self.host_values:
            synced = _host_value_in(args, kwargs, self.host_values)
            if synced is not None:
                self.seq += 1
                best = Origin(synced, "host-sync", self.seq)
        data_dep = fname in _DATA_DEPENDENT or (
            fname == "__getitem__" and len(args) > 1 and _has_bool_index(args[1]))
        triple = (where, best.where if best else None, best.cause if best else None,
                  "device" if on_device else "host")
        if _RecordFunction is not None:
            with _RecordFunction(f"opscope#{self.table.intern(triple)}"):
                out = func(*args, **kwargs)
        else:  # pragma: no cover - older torch
            with torch.autograd.profiler.record_function(f"opscope#{self.table.intern(triple)}"):
                out = func(*args, **kwargs)
        if on_device and self.remapper is not None:
            for t in _iter_tensors(out):
                try:
                    t._opscope_dev = True
                except Exception:
                    pass
        if fname in _HOST_SYNC and where:
            for value in (out if isinstance(out, list) else [out]):
                if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                    self.host_values[value] = where
        if where is None:
            return out
        if data_dep:
            self.seq += 1
            origin = Origin(where, "data-dependent-output", self.seq)
            shapes = tuple(tuple(t.shape) for t in _iter_tensors(out))
            self.data_dependent_outputs.setdefault((where, PYTHON_TO_ATEN.get(fname, fname)), set()).add(shapes)
        elif best is not None:
            origin = best
        elif not any(True for _ in _iter_tensors(args)):
            # a factory call at a user line: the tensor is born here
            self.seq += 1
            origin = Origin(where, "input-varies", self.seq)
        else:
            origin = None
        if origin is not None:
            for t in _iter_tensors(out):
                if getattr(t, "_opscope_origin", None) is None or data_dep or t is not (args[0] if args else None):
                    try:
                        t._opscope_origin = origin
                    except Exception:
                        pass
        return out


def _is_accel(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type != "cpu"
    return isinstance(device, str) and device.split(":")[0] not in ("cpu", "meta")


def _has_bool_index(index) -> bool:
    for t in _iter_tensors(index if isinstance(index, (tuple, list)) else (index,)):
        if t.dtype == torch.bool:
            return True
    return False


def _host_value_in(args, kwargs, values: dict) -> str | None:
    """Line of a host-synced int used as a size/slice bound in this call, if any."""
    def scan(obj, depth=0):
        if isinstance(obj, bool):
            return None
        if isinstance(obj, int):
            return values.get(obj)
        if isinstance(obj, slice):
            return scan(obj.start, depth) or scan(obj.stop, depth)
        if depth < 2 and isinstance(obj, (tuple, list, torch.Size)):
            for item in obj:
                hit = scan(item, depth + 1)
                if hit:
                    return hit
        return None
    return scan(args) or scan(tuple(kwargs.values()))
