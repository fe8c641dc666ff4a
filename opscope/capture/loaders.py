"""What a DataLoader is made of: who builds it, which collate function and sampler set its shapes.

A dynamic-shape root cause at a DataLoader is only actionable when it names the call that
sets the batch's shape (``DataCollatorWithPadding`` padding to the longest sequence, a
``pad_sequence`` in a collate function) with its settings, and the framework that built the
loader (``Trainer`` builds it from ``TrainingArguments``).  Recorded at the loader's
construction; read by ``analysis/dynamic_shapes.py``.
"""
from __future__ import annotations

import functools
import sys

from opscope.capture.patches import Restore, RestoreAll
from opscope.knowledge import load
from opscope.model import loader_key


def _knowledge() -> dict:
    return load("dynamic_shapes.yaml")


def _plain(value):
    """A JSON-safe setting value (an enum such as transformers' PaddingStrategy by its value)."""
    value = getattr(value, "value", value)
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def describe_callable(fn, user_code) -> dict | None:
    """{"name", "where", "settings"} of a collate function or callable object; None for torch's default."""
    if fn is None:
        return None
    target = fn.func if isinstance(fn, functools.partial) else fn
    for _ in range(3):   # wrappers around the user's collator (Trainer's RemoveColumnsCollator)
        inner = next((getattr(target, a) for a in _knowledge().get("collate_wrapped") or []
                      if callable(getattr(target, a, None))), None)
        if inner is None or hasattr(target, "__code__"):
            break
        target = fn = inner
    is_function = hasattr(target, "__code__")
    code = getattr(target, "__code__", None) or getattr(getattr(type(target), "__call__", None), "__code__", None)  # noqa: B004 - reads its __code__
    name = getattr(target, "__qualname__", None) if is_function else type(target).__qualname__
    module = getattr(target, "__module__", None) if is_function else type(target).__module__
    if (module or "").startswith("torch.utils.data"):
        return None   # default_collate / default_convert: stacks samples as they are
    where = None
    if code is not None:
        shown = user_code.display(code.co_filename) or user_code.library(code.co_filename)
        if shown:
            where = f"{shown}:{code.co_firstlineno}"
    settings = {}
    for attr in _knowledge().get("collate_settings") or []:
        if not is_function and hasattr(target, attr):
            settings[attr] = _plain(getattr(target, attr))
    if isinstance(fn, functools.partial):
        settings.update({k: _plain(v) for k, v in fn.keywords.items() if k in (_knowledge().get("collate_settings") or [])})
    described = {"name": name, "module": module, "where": where, "settings": settings}
    built_at = None if is_function else getattr(target, BUILT_AT, None)
    if built_at:
        described["built_at"] = built_at
    return described


def describe_sampler(loader) -> dict | None:
    """The sampler's class and, for DistributedSampler-like ones, replicas and samples per rank."""
    sampler = getattr(loader, "sampler", None)
    if sampler is None:
        return None
    info: dict = {"name": type(sampler).__name__}
    for attr in ("num_replicas", "drop_last", "num_samples"):
        value = getattr(sampler, attr, None)
        if isinstance(value, (bool, int)):
            info[attr] = value
    return info


def samples_per_epoch(loader) -> int | None:
    """How many samples this process's loader yields per epoch: its sampler's length (one rank's
    share under DistributedSampler, which pads to equal shares), else the dataset's."""
    for get in (lambda: len(loader.sampler), lambda: len(loader.dataset)):
        try:
            return int(get())
        except Exception:  # an IterableDataset / sampler without __len__
            continue
    return None


def construction_site(user_code, frame) -> tuple[str | None, list[str]]:
    """(user line, library lines below it, innermost first) of the code constructing a DataLoader:
    the innermost says where, the outer ones which framework built it (Trainer via accelerate)."""
    libraries: list[str] = []
    while frame is not None:
        filename = frame.f_code.co_filename
        shown = user_code.display(filename)
        if shown is not None:
            return f"{shown}:{frame.f_lineno}", libraries
        if (lib := user_code.library(filename)) is not None and len(libraries) < 12:
            libraries.append(f"{lib}:{frame.f_lineno}")
        frame = frame.f_back
    return None, libraries


def install_dataloader_tagging(session) -> list:
    """Batches from a DataLoader carry its construction line as their shape origin; each fetch is
    labelled ``opscope.dataloader`` and counted (epochs, batches) for the partial-batch analysis.
    Returns the patches to undo."""
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    record_function = getattr(torch._C._profiler, "_RecordFunctionFast", None)   # cheap profiler annotations
    orig_init = DataLoader.__init__
    orig_next = _BaseDataLoaderIter.__next__

    def init(this, *args, **kwargs):
        where, stack = construction_site(session.user_code, sys._getframe(1))
        library = stack[0] if stack else None
        this._opscope_site = loader_key(where, library) if where else None
        this._opscope_where = (where, library)
        out = orig_init(this, *args, **kwargs)
        if this._opscope_site:
            # what the analysis needs to say whether an epoch end (a partial last batch) was seen,
            # and which collate function / sampler / framework sets the batches' shapes
            info = {"drop_last": bool(getattr(this, "drop_last", kwargs.get("drop_last", False))),
                    # (a loader built from a batch sampler, as accelerate's are, has batch_size None)
                    "batch_size": getattr(this, "batch_size", None)
                    or getattr(getattr(this, "batch_sampler", None), "batch_size", None), "length": None,
                    "workers": int(getattr(this, "num_workers", 0) or 0),
                    "dataset_size": samples_per_epoch(this), "batches": 0, "epochs_finished": 0,
                    "iterators": 0, "where": where, "library": library, "built_in": stack,
                    "collate": describe_callable(getattr(this, "collate_fn", None), session.user_code),
                    "sampler": describe_sampler(this)}
            try:
                info["length"] = int(len(this))
            except Exception:  # an IterableDataset without __len__
                pass
            session.dataloaders[this._opscope_site] = info
        return out

    def next_(this):
        session.safe_point()
        if session.optimizer_seen:
            session._end_update()
        loader = getattr(this, "_opscope_loader_ref", None)
        site = getattr(loader, "_opscope_site", None)
        where, library = getattr(loader, "_opscope_where", (None, None))
        info = session.dataloaders.get(site) if site else None
        loading = session.tracker.begin_loading(where, library)
        try:
            if record_function is not None and session.prof is not None:
                with record_function("opscope.dataloader"):
                    batch = orig_next(this)
            else:
                batch = orig_next(this)
        except StopIteration:
            if info is not None:
                info["epochs_finished"] += 1
            raise
        finally:
            session.tracker.end_loading(loading)
        if site and where:
            if info is not None:
                this._opscope_batches = getattr(this, "_opscope_batches", 0) + 1
                info["batches"] = max(info["batches"], this._opscope_batches)
            session.tracker.tag(batch, where, "loader", library)
        return batch

    orig_iter_init = _BaseDataLoaderIter.__init__

    def iter_init(this, loader, *args, **kwargs):
        this._opscope_loader_ref = loader
        info = session.dataloaders.get(getattr(loader, "_opscope_site", None) or "")
        if info is not None:
            info["iterators"] += 1
        return orig_iter_init(this, loader, *args, **kwargs)

    DataLoader.__init__ = init   # type: ignore[method-assign,assignment]
    _BaseDataLoaderIter.__next__ = next_   # type: ignore[method-assign]
    _BaseDataLoaderIter.__init__ = iter_init   # type: ignore[method-assign,assignment]
    return [Restore(DataLoader, "__init__", orig_init), Restore(_BaseDataLoaderIter, "__next__", orig_next),
            Restore(_BaseDataLoaderIter, "__init__", orig_iter_init), *install_collator_sites(session)]


BUILT_AT = "_opscope_built_at"   # the user's line that built a collator (see install_collator_sites)


def install_collator_sites(session) -> list:
    """Each collator class that sets batch shapes (``shape_setters`` with a ``module`` in
    ``dynamic_shapes.yaml``) remembers the user's line that built it, so a root cause it sets points at the
    ``DataCollatorWithPadding(...)`` line, not at the ``trainer.train()`` that built the DataLoader from it."""
    from opscope.capture.import_hooks import after_import
    classes: dict[str, list[str]] = {}
    for name, spec in (_knowledge().get("shape_setters") or {}).items():
        if isinstance(spec, dict) and spec.get("module"):
            classes.setdefault(spec["module"], []).append(name)
    restores: list = []

    def patch(module) -> None:
        for name in classes.get(module.__name__, []):
            cls = getattr(module, name, None)
            init = vars(cls).get("__init__") if isinstance(cls, type) else None
            if init is not None and not hasattr(init, "__opscope__"):
                restores.append(Restore(cls, "__init__", init))
                setattr(cls, "__init__", _remembering(init, session))   # noqa: B010 - a class's own __init__

    return [*after_import({module: patch for module in classes}), RestoreAll(restores)]


def _remembering(init, session):
    def remembering_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if getattr(self, BUILT_AT, None) is None:   # the outermost constructor's caller, once
            where, _ = construction_site(session.user_code, sys._getframe(1))
            try:
                object.__setattr__(self, BUILT_AT, where)
            except (AttributeError, TypeError):   # a class with __slots__: no line, nothing else changes
                pass
    remembering_init.__opscope__ = True   # type: ignore[attr-defined]
    remembering_init.__wrapped__ = init   # type: ignore[attr-defined]
    return remembering_init
