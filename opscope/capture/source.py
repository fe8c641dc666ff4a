"""Attribute every operator to the user's source line, and track where shapes come from.

The profiler alone cannot say which line of *the user's* code caused an operator
(its Python tracer only knows function definitions).  A ``TorchFunctionMode`` sees
every outermost torch call made from Python; for each one we find the first frame in
the user's code and wrap the call in a tiny profiler annotation ``opscope#<id>``.
Every ATen op recorded under that annotation belongs to that line.

The same hook tags output tensors with their *origins*: the set of user lines whose
calls set the shape of the data they carry (a DataLoader batch, a factory call, a slice
or view whose sizes come from arguments, a data-dependent op such as ``nonzero``, a
size read back with ``.item()``), passed on by tensor identity from inputs to outputs.
Each origin records the output shapes it produced in every step and the origins of its
own inputs (its parents), so the analysis can find where a varying size *enters*: an
origin whose shapes changed while its parents' did not.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from sysconfig import get_paths
from types import FrameType
from typing import Literal

import torch
from torch.overrides import TorchFunctionMode

_RecordFunction = getattr(torch._C._profiler, "_RecordFunctionFast", None)

# A forked process (a DataLoader worker) must not annotate: it learns it is a fork once, here,
# instead of asking the OS for its pid on every torch call.
_IN_FORK = [False]
os.register_at_fork(after_in_child=lambda: _IN_FORK.__setitem__(0, True))
_get_ident = threading.get_ident
_Tensor = torch.Tensor

# Calls that never launch an operator: no annotation needed (keeps overhead low).
_NO_OP_FUNCS = frozenset({
    "__get__", "__set__", "size", "dim", "numel", "__len__", "__repr__", "__format__",
    "__hash__", "__bool__", "data_ptr", "element_size", "is_contiguous", "stride",
    "storage_offset", "has_names", "is_floating_point", "is_complex", "get_device",
    "__iter__", "type", "__reduce_ex__", "__setstate__", "__deepcopy__", "untyped_storage",
    "requires_grad_", "register_hook", "_is_view", "is_leaf", "__dlpack__",
})


from opscope.knowledge import load as _load  # noqa: E402

KNOWLEDGE = _load("dynamic_shapes.yaml")
# Python calls whose output shape depends on tensor *values* -> the ATen op they run.
PYTHON_TO_ATEN: dict = KNOWLEDGE["python_to_aten"]
_DATA_DEPENDENT = frozenset(k for k in PYTHON_TO_ATEN if k != "__getitem__")
# Calls whose output sizes come from their (non-tensor) arguments -> origin kind.
_SIZED: dict = KNOWLEDGE["size_from_arguments"]
# Calls inside a collate function that set a batch's shape (pad_sequence): named by the root cause.
_SHAPE_SETTERS = frozenset(k for k, v in (KNOWLEDGE.get("shape_setters") or {}).items() if v.get("call"))
# Calls that copy a tensor value to the host as a Python number (sizes built from it vary).
_HOST_SYNC = frozenset({"item", "tolist", "__int__", "__index__"})
_MOVES_TO_DEVICE = frozenset({"to", "cuda", "npu"})

_LIB_DIRS = tuple({
    str(Path(p).resolve()) for p in (
        get_paths().get("stdlib"), get_paths().get("purelib"),
        get_paths().get("platlib"), os.path.dirname(os.__file__),
    ) if p
}) + (str(Path(torch.__file__).resolve().parent.parent),)
_OPSCOPE_DIR = str(Path(__file__).resolve().parent.parent) + os.sep
# torch itself (and its private helpers): never "the library code that made an operator".  Folders end with
# the separator: torchvision, torchaudio and torch_scatter are libraries, not torch.
_TORCH_DIRS = (str(Path(torch.__file__ or "").resolve().parent) + os.sep,) + tuple(
    str(Path(torch.__file__).resolve().parent.parent / name) + os.sep for name in ("functorch", "torchgen", "triton"))
_STDLIB_DIRS = tuple({str(Path(p).resolve()) for p in (
    get_paths().get("stdlib"), get_paths().get("platstdlib"), os.path.dirname(os.__file__)) if p})


class SourceTable:
    """Interns (source, origin, kind, device|host|import, origin ids, library line) tuples: annotations stay short (``opscope#17``)."""

    def __init__(self):
        self.ids: dict[tuple, int] = {}
        self.entries: list[tuple] = []
        self.labels: list[str] = []   # "opscope#<id>" per entry: made once, not per call

    def intern(self, triple: tuple) -> int:
        idx = self.ids.get(triple)
        if idx is None:
            idx = len(self.entries)
            self.ids[triple] = idx
            self.entries.append(triple)
            self.labels.append(f"opscope#{idx}")
        return idx


class UserCode:
    """Decides whether a file is the user's code (not stdlib, site-packages, torch, opscope).

    Library code that is neither torch nor the standard library (transformers, lightning,
    timm, a model zoo) is "library": the innermost such frame under the user's line says
    which model/library line made an operator when the user's line is ``trainer.train()``.
    """

    def __init__(self, root: str | None = None):
        self.root = str(Path(root).resolve()) if root else None
        self._cache: dict[str, str | None] = {}
        self._lib_cache: dict[str, str | None] = {}
        # per code object, by its id: (user display path or None, library path or None, an import machinery
        # frame, the code object).  By id: a code object's hash is computed anew from its fields at every
        # lookup, about half of the frame walk each torch call makes; the entry holds the code, so its id
        # is never reused by another while the entry exists
        self.by_code: dict[int, tuple] = {}

    def code_info(self, code) -> tuple:
        """What a frame running ``code`` says about the call: computed once per code object."""
        info = self.by_code.get(id(code))
        if info is None or info[3] is not code:
            filename = code.co_filename
            shown = self.display(filename)
            info = self.by_code[id(code)] = (shown, None if shown is not None else self.library(filename),
                                             filename.startswith("<frozen importlib"), code)
        return info

    def library(self, filename: str) -> str | None:
        """The path to show for a library file (relative to its site-packages), or None for
        user code, torch, the standard library, opscope and generated code."""
        hit: str | None | Literal[False] = self._lib_cache.get(filename, False)
        if hit is not False:
            return hit
        result = None
        if filename and not filename.startswith("<") and self.display(filename) is None:
            path = str(Path(filename).resolve())
            installed = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
            # (a virtual environment's "stdlib" path is the folder holding its site-packages)
            if not (path.startswith(_TORCH_DIRS) or path.startswith(_OPSCOPE_DIR)
                    or (not installed and path.startswith(_STDLIB_DIRS))):
                result = _site_relative(path)
        self._lib_cache[filename] = result
        return result

    def display(self, filename: str) -> str | None:
        """Return the path to show for a user file, or None if it is library code."""
        hit: str | None | Literal[False] = self._cache.get(filename, False)
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

    def library_of(self, frame) -> str | None:
        """Innermost library frame at or above ``frame``, below the first user frame, as "file:line"."""
        while frame is not None:
            if self.display(frame.f_code.co_filename) is not None:
                return None
            lib = self.library(frame.f_code.co_filename)
            if lib is not None:
                return f"{lib}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def frame_of(self, frame) -> tuple[str, int] | None:
        """First user frame at or above ``frame`` as (display path, line)."""
        while frame is not None:
            shown = self.display(frame.f_code.co_filename)
            if shown is not None:
                return shown, frame.f_lineno
            frame = frame.f_back
        return None


_LINE_TEXT: dict = {}


def _line_text(path: str, line: int) -> str:
    """``"path:line"``, one shared string per line (no new string per torch call)."""
    key = (path, line)
    text = _LINE_TEXT.get(key)
    if text is None:
        text = _LINE_TEXT[key] = f"{path}:{line}"
    return text


def _site_relative(path: str) -> str:
    """``.../site-packages/transformers/trainer.py`` -> ``transformers/trainer.py``."""
    for marker in ("site-packages", "dist-packages"):
        head, sep, tail = path.rpartition(os.sep + marker + os.sep)
        if sep:
            return tail
    best = max((p for p in sys.path if p and path.startswith(p.rstrip(os.sep) + os.sep)), key=len, default="")
    return os.path.relpath(path, best) if best else path


def iter_tensors(obj, depth=0, max_depth=2, mappings: type | tuple = dict):
    """The tensors of a torch call's arguments or result: two levels of lists, tuples and dicts (cheap, per call)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < max_depth and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item, depth + 1, max_depth, mappings)
    elif depth < max_depth and isinstance(obj, mappings):
        for item in obj.values():   # type: ignore[union-attr]  # a dict or a Mapping, as asked
            yield from iter_tensors(item, depth + 1, max_depth, mappings)


def _iter_batch(obj):
    """The tensors of a DataLoader batch: three levels, also inside mappings that are not dicts
    (transformers' BatchEncoding is a UserDict), which the per-call walk leaves out for speed."""
    return iter_tensors(obj, 0, 3, Mapping)


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
        self.owner_thread = threading.get_ident()
        self.host_values: dict[int, str] = {}                # int value read by .item() -> line
        self.host_parents: dict[int, set] = {}               # host call (table id) -> host calls of its inputs
        # origins: (line, kind) -> id; per id its parents (origins of its inputs) and the
        # Python calls seen; what changed since the last step is reported with the step
        self.origin_ids: dict[tuple, int] = {}
        self.origin_meta: dict[int, tuple] = {}              # id -> (line, kind, parents set, calls set)
        self.changed_origins: set = set()
        self.origin_shapes: dict[int, set] = {}              # this step: id -> output shape tuples
        self.loading: int | None = None                           # loader origin while a DataLoader fetches
        # Set by the session when a step ended inside an open profiler range (e.g. the
        # optimizer's post-hook): the profiler is only restarted at the next safe point,
        # the entry of an outermost torch call, never inside a record_function range.
        self.boundary_pending = False
        self.on_safe_point: Callable[[], None] | None = None
        # Bounded capture memory: the session stops recording a step after this many calls.
        self.calls_in_step = 0
        self.call_cap = 0
        self.on_call_cap: Callable[[], None] | None = None

    # -- helpers -----------------------------------------------------------------
    def _where(self, depth: int = 2) -> tuple[str | None, bool, str | None]:
        """(first user frame as "file:line", whether a module import is under way below it,
        innermost library frame below the user's as "file:line" or None)."""
        frame: FrameType | None = sys._getframe(depth)
        importing = False
        library = None
        by_code, code_info = self.user_code.by_code, self.user_code.code_info
        while frame is not None:
            code = frame.f_code
            info = by_code.get(id(code)) or code_info(code)
            if info[0] is not None:
                text = _LINE_TEXT.get((info[0], frame.f_lineno))   # _line_text, inlined: once per torch call
                return text or _line_text(info[0], frame.f_lineno), importing, library
            if library is None and info[1] is not None:
                library = _line_text(info[1], frame.f_lineno)
            if info[2]:
                importing = True
            frame = frame.f_back
        return None, importing, library

    def _origin(self, where: str, kind: str, parents, call: str, library: str | None = None) -> int:
        # keyed by the library line too: under trainer.train() every library call has the same
        # user line, and one origin for all of them would mix unrelated tensors' shapes
        key = (where, kind, library)
        oid = self.origin_ids.get(key)
        if oid is None:
            oid = self.origin_ids[key] = len(self.origin_ids)
            self.origin_meta[oid] = (where, kind, set(), set(), library)
            self.changed_origins.add(oid)
        _, _, known_parents, calls, _ = self.origin_meta[oid]
        if parents and not parents <= known_parents:
            known_parents.update(p for p in parents if p != oid)
            self.changed_origins.add(oid)
        if call not in calls:
            calls.add(call)
            self.changed_origins.add(oid)
        return oid

    def _produced(self, oid: int, obj, batch: bool = False) -> frozenset:
        """Record the shapes ``obj`` has as an output of origin ``oid``; tag its tensors."""
        tensors = list(_iter_batch(obj) if batch else iter_tensors(obj))
        self.origin_shapes.setdefault(oid, set()).add(tuple(tuple(t.shape) for t in tensors))
        return frozenset((oid,))

    def tag(self, obj, where: str, cause: str = "loader", library: str | None = None) -> None:
        """Mark tensors in ``obj`` (a DataLoader batch) as originating at ``where``."""
        oid = self._origin(where, "loader", (), "DataLoader", library)
        origins = self._produced(oid, obj, batch=True)
        for t in _iter_batch(obj):
            try:
                t._opscope_origins = origins
            except Exception:
                pass

    # -- host batches: host work whose result the script then moves to the device -----------
    def _moved_to_device(self, args, outs: tuple) -> None:
        """``.to``/``.cuda``/``.npu`` on a real device: the copy of a host tensor shows the move."""
        if self.remapper is None and args and isinstance(args[0], torch.Tensor) \
                and args[0].device.type == "cpu" and any(t.device.type != "cpu" for t in outs):
            self._host_batch_moved(args)

    def _note_host_work(self, host_calls: set | None, outs: tuple, idx: int) -> None:
        """Remember which host call made each host tensor (``host_calls``: the host calls that made its
        inputs), so that a later ``.to(device)`` of it marks that work as data preparation (``host_batch_moved``)."""
        if host_calls:
            self.host_parents.setdefault(idx, set()).update(host_calls)
        for t in outs:
            try:
                t._opscope_host_call = idx
            except Exception:
                pass

    def _host_batch_moved(self, args) -> None:
        """``args[0]`` (a host tensor) is being moved to the device: the host calls that built it
        (``torch.stack`` of CPU samples, their slices) are data preparation, not device work."""
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or getattr(first, "_opscope_dev", False):
            return
        todo = [getattr(first, "_opscope_host_call", None)]
        while todo:
            idx = todo.pop()
            if idx is None or idx >= len(self.table.entries) or self.table.entries[idx][3] != "host":
                continue
            entry = self.table.entries[idx]
            from opscope.model import HOST_BATCH
            self.table.entries[idx] = entry[:3] + (HOST_BATCH,) + entry[4:]
            todo.extend(self.host_parents.pop(idx, ()))

    def begin_loading(self, where: str | None, library: str | None = None):
        """A DataLoader at ``where`` is fetching a batch: its operators belong to that loader.

        Returns the previous state, for ``end_loading``.
        """
        previous = self.loading
        if where:
            self.loading = self._origin(where, "loader", (), "DataLoader", library)
        return previous

    def end_loading(self, previous) -> None:
        self.loading = previous

    def reset_step(self) -> dict:
        """Return and clear per-step side data: new/changed origins and the shapes each produced."""
        data = {
            "origins": {str(oid): [self.origin_meta[oid][0], self.origin_meta[oid][1],
                                   sorted(self.origin_meta[oid][2]), sorted(self.origin_meta[oid][3]),
                                   self.origin_meta[oid][4]]
                        for oid in sorted(self.changed_origins)},
            "origin_shapes": {str(oid): sorted([list(map(list, s)) for s in shapes])
                              for oid, shapes in self.origin_shapes.items()},
        }
        self.host_values.clear()
        self.changed_origins.clear()
        self.origin_shapes.clear()
        return data

    # -- the hook ----------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = _NO_KWARGS
        if _IN_FORK[0]:
            return func(*args, **kwargs)
        if getattr(func, "namespace", None) == "profiler":
            # record_function enter/exit: not a safe point (a range is still open) and
            # not the user's operator
            return func(*args, **kwargs)
        on_owner = _get_ident() == self.owner_thread
        if self.boundary_pending and on_owner:
            self.on_safe_point()   # type: ignore[misc]  # set by the session that sets boundary_pending
        moved = False
        if self.remapper is not None:
            args, kwargs, handled, result = self.remapper.on_call(func, args, kwargs)
            moved = self.remapper.moved
            if moved:
                self._host_batch_moved(args)
            if handled:
                if moved and isinstance(result, torch.Tensor):
                    result._opscope_dev = True   # type: ignore[attr-defined]
                _pass_origins(args, result)
                return result
        fname = getattr(func, "__name__", "")
        if fname in _NO_OP_FUNCS or not on_owner:
            out = func(*args, **kwargs)
            if fname == "__get__":  # x.data, x.T, x.mT: the same data, the same origins
                _pass_origins(args, out)
            return out
        self.calls_in_step += 1
        if self.calls_in_step == self.call_cap and self.on_call_cap is not None:
            self.on_call_cap()
        where, importing, library = self._where()
        if self.loading is not None and fname in _SHAPE_SETTERS and (setter_at := library or where):
            self._note_collate_setter(fname, setter_at, self.loading)
        origins, has_tensors, on_device, host_calls = _tensor_inputs(
            args, kwargs, moved or _is_accel(kwargs.get("device")))
        kind, at = self._kind_of(fname, args, kwargs, where, has_tensors)
        oid = self._new_origin(fname, kind, at, where, origins, library) if kind is not None else None
        device = "device" if on_device else ("import" if importing else "host")
        idx = self._label(where, origins, oid, device, library)
        if _RecordFunction is not None:
            with _RecordFunction(self.table.labels[idx]):
                out = func(*args, **kwargs)
        else:  # pragma: no cover - older torch
            with torch.autograd.profiler.record_function(self.table.labels[idx]):
                out = func(*args, **kwargs)
        # the output tensors, once: a lone tensor (most calls) without the nested walk
        outs = (out,) if type(out) is _Tensor else tuple(iter_tensors(out))
        self._note_outputs(fname, args, out, outs, device, host_calls, idx, where)
        if where is None or (kind is None and not origins):
            return out
        _tag_origins(args, outs, origins | self._produced(oid, out) if oid is not None else origins, kind)
        return out

    def _note_collate_setter(self, fname: str, at: str, loading: int) -> None:
        """A collate function padding the batch: the loader's root cause names this call."""
        setter, calls = f"{fname} at {at}", self.origin_meta[loading][3]
        if setter not in calls:
            calls.add(setter)
            self.changed_origins.add(loading)

    def _new_origin(self, fname: str, kind: str, at, where, origins: frozenset, library) -> int | None:
        """The origin this call creates, or None inside a DataLoader's next() (the dataset, the collate
        function), where the batch as a whole is the origin: a collate function's padding or torch.tensor()
        is fixed at the DataLoader."""
        if where is None or self.loading is not None:
            return None
        parents = () if kind in ("host-sync", "factory") else origins
        assert at is not None   # `where` or the synced value's line, both checked by _kind_of
        return self._origin(at, kind, parents, PYTHON_TO_ATEN.get(fname, fname) if kind == "data-dependent-output"
                            else fname, library if at == where else None)

    def _kind_of(self, fname: str, args, kwargs, where, has_tensors: bool) -> tuple:
        """``(kind, line)``: whether this call creates an origin of shapes (a factory, a data-dependent
        output, a value read back from the device, a sized view) and the line that names it."""
        if fname in _DATA_DEPENDENT or (fname == "__getitem__" and len(args) > 1 and _has_bool_index(args[1])):
            return "data-dependent-output", where
        if self.host_values and (synced := _host_value_in(args, kwargs, self.host_values)) is not None:
            return "host-sync", synced
        if not has_tensors:
            return "factory", where
        return _SIZED.get(fname), where

    def _label(self, where, origins: frozenset, oid, device: str, library) -> int:
        """The source-table entry of this call's operators: sized by its inputs, by the origin it creates
        (a factory, a view or slice sizes its own kernels; a data-dependent op's kernels and backward follow
        its output size) and, inside a DataLoader's next(), by the batch."""
        annotated = origins
        if oid is not None:
            annotated = annotated | {oid}
        if self.loading is not None:
            annotated = annotated | {self.loading}
        newest = self.origin_meta[max(annotated)] if annotated else None
        triple = (where, newest[0] if newest else None, newest[1] if newest else None, device,
                  tuple(sorted(annotated)), library)
        return self.table.intern(triple)

    def _note_outputs(self, fname: str, args, out, outs: tuple, device: str, host_calls, idx: int, where) -> None:
        """What the outputs tell: they are on the device, moved there, host work, or a value read back."""
        if device == "device" and self.remapper is not None:
            for t in outs:
                try:
                    t._opscope_dev = True
                except Exception:
                    pass
        if fname in _MOVES_TO_DEVICE:
            self._moved_to_device(args, outs)
        if device == "host":
            self._note_host_work(host_calls, outs, idx)
        if fname in _HOST_SYNC and where and self.user_code.display(sys._getframe(2).f_code.co_filename):
            # only a value the user's own line reads back (not library bookkeeping)
            for value in (out if isinstance(out, list) else [out]):
                if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                    self.host_values[value] = where


_NO_KWARGS: dict = {}   # shared, never written: a call without keyword arguments allocates none


def _tensor_inputs(args: tuple, kwargs: dict, on_device: bool) -> tuple:
    """``(origins, has_tensors, on_device, host_calls)`` of a call's tensor inputs: every origin among
    them (by tensor identity), whether any is on the device, and the host calls that made the host ones."""
    origins: frozenset = frozenset()
    has_tensors = False
    host_calls = None
    tensors = args if _plain_tensors(args) else iter_tensors(args)
    if kwargs:
        tensors = itertools.chain(tensors, iter_tensors(kwargs))
    for t in tensors:
        if type(t) is not _Tensor and not isinstance(t, _Tensor):
            continue   # a plain argument of a flat call
        has_tensors = True
        o = getattr(t, "_opscope_origins", None)
        if o:
            origins = origins | o
        if not on_device:
            # (is_cpu: what device.type == "cpu" says, without building a device object per tensor)
            if not t.is_cpu or getattr(t, "_opscope_dev", False):
                on_device = True
            else:
                host = getattr(t, "_opscope_host_call", None)
                if host is not None:
                    if host_calls is None:
                        host_calls = {host}
                    else:
                        host_calls.add(host)
    return origins, has_tensors, on_device, host_calls


def _tag_origins(args: tuple, outs: tuple, out_origins: frozenset, kind) -> None:
    """The outputs carry the origins of their shapes; an in-place op keeps its tensor's."""
    first = args[0] if args else None
    for t in outs:
        if t is first and kind is None and getattr(t, "_opscope_origins", None):
            continue  # an in-place op keeps its tensor's shape and origins
        try:
            t._opscope_origins = out_origins
        except Exception:
            pass


def _plain_tensors(args: tuple) -> bool:
    """True when no argument is a list, tuple or dict (the common ``F.relu(x)``, ``x + y``): the
    arguments can be walked directly instead of through the nested ``iter_tensors`` generator."""
    for a in args:
        if type(a) in _CONTAINERS:
            return False
    return True


_CONTAINERS = frozenset({list, tuple, dict})


def _pass_origins(args, out) -> None:
    """Give ``out`` (a tensor standing for ``args[0]``'s data) the origins of ``args[0]``."""
    if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor) and out is not args[0]:
        origins = getattr(args[0], "_opscope_origins", None)
        if origins and getattr(out, "_opscope_origins", None) is None:
            try:
                out._opscope_origins = origins   # type: ignore[attr-defined]
            except Exception:
                pass


def _is_accel(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type != "cpu"
    return isinstance(device, str) and device.split(":")[0] not in ("cpu", "meta")


def _has_bool_index(index) -> bool:
    for t in iter_tensors(index if isinstance(index, (tuple, list)) else (index,)):
        if t.dtype == torch.bool:
            return True
    return False


def _host_value_in(args, kwargs, values: dict) -> str | None:
    """Line of a host-synced int used as a size/slice bound in this call, if any."""
    return _bound_in(args, values, 0) or (_bound_in(tuple(kwargs.values()), values, 0) if kwargs else None)


def _bound_in(obj, values: dict, depth: int) -> str | None:
    """``_host_value_in``'s walk (a module function: no closure built on every torch call)."""
    if isinstance(obj, bool):
        return None
    if isinstance(obj, int):
        return values.get(obj)
    if isinstance(obj, slice):
        return _bound_in(obj.start, values, depth) or _bound_in(obj.stop, values, depth)
    if depth < 2 and isinstance(obj, (tuple, list, torch.Size)):
        for item in obj:
            hit = _bound_in(item, values, depth + 1)
            if hit:
                return hit
    return None
