"""Turn raw profiler (Kineto) events of one step into ``OpCall`` records.

We read ``prof.profiler.kineto_results.events()`` directly instead of
``prof.events()``/``key_averages()``: it is several times faster and keeps what we
need (shapes, dtypes, concrete scalars, sequence numbers).  This module is only the
Kineto adapter: each event's fields are read once into the normalised record of
``opscope.parsers.calls``, whose builder (the same one trace files use) nests them per
thread from timestamps, like the profiler's own FunctionEvent tree.
"""
from __future__ import annotations

from typing import Any

from opscope.capture.device_memory import MEMORY_EVENT, MEMORY_MARK, is_phase_range
from opscope.knowledge import is_backend_private
from opscope.model import OpCall, freeze
from opscope.parsers.calls import MARK, MODE, OPERATOR, PRIVATE, TABLE, CallBuilder, Launch, Reading

BOOKKEEPING_PREFIXES = ("profiler::", "autograd::engine::", "torch::autograd::", "ProfilerStep#")


def is_operator(name: str) -> bool:
    """ATen and other dispatcher ops (``ns::op``); not profiler bookkeeping or annotations."""
    return "::" in name and not name.startswith(BOOKKEEPING_PREFIXES) and " " not in name.split("::", 1)[0]


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _jsonable(value):
    if isinstance(value, list):
        for v in value:
            if type(v) not in _PLAIN:
                break
        else:   # the common case, a list of dimensions: the profiler made it for us, keep it
            return value
        return [v if type(v) in _PLAIN else _jsonable(v) for v in value]
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, tuple):
        return _jsonable(list(value))
    return str(value)


def _phase_from(name: str) -> str | None:
    if name.startswith(("autograd::engine::evaluate_function", "opscope.backward")):
        return "backward"
    if name.startswith("opscope.forward"):
        return "forward"
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#", "opscope.optimizer")):
        return "optimizer"
    if name.startswith(("opscope.dataloader", "opscope.setup")):
        return "other"
    if name.startswith("opscope.eval"):
        return "eval"
    return None


def _classify(name: str) -> int:
    if name.startswith("opscope#"):
        return TABLE
    if name == "PythonDispatchMode":
        # a Python dispatch mode (--mode fake's fake tensors) implementing the enclosing operator: what
        # it runs inside is its own bookkeeping, not operators of the job
        return MODE
    if not is_operator(name):
        return MARK
    return PRIVATE if is_backend_private(name) else OPERATOR


def _details(rec: tuple) -> tuple:
    e = rec[6]
    # shapes() is always a list of dimension lists of ints (the profiler's vector<vector<int64>>): JSON as it is
    dtypes = list(e.dtypes())
    shapes = e.shapes()
    if "TensorList" in dtypes and _STRUCTURED:   # shapes() has [] for a tensor list; the nested shapes are
        shapes = e.structured_input_shapes()     # the Chrome trace's "Input Dims" (torch >= 2.5)
    return shapes, dtypes, _jsonable(e.concrete_inputs()), None


try:
    from torch._C._autograd import _KinetoEvent as _Event
    _STRUCTURED = hasattr(_Event, "structured_input_shapes")
    _ACTIVITY = hasattr(_Event, "activity_type")
    _USER_ANNOTATION = hasattr(_Event, "is_user_annotation")
except ImportError:  # pragma: no cover
    _STRUCTURED = _ACTIVITY = _USER_ANNOTATION = False

# Kineto's activity types (``_KinetoEvent.activity_type()``) of a host-side call into the device runtime that
# starts device work, and of the device work itself: what an operator's device time is made of (never a
# device-side copy of a host annotation, ``gpu_user_annotation``, nor a synchronisation wait)
LAUNCH_TYPES = frozenset({"cuda_runtime", "cuda_driver", "xpu_runtime", "xpu_driver", "privateuse1_runtime",
                          "privateuse1_driver", "mtia_runtime"})
TASK_TYPES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def launch_of(e, corr) -> Launch | None:
    """The ids of a host event that is a device runtime call, None for a profiler range (annotation).

    Read while the step's events are all alive: ``linked_correlation_id()`` follows a weak reference to the
    operator the call was made in, which is gone once that operator's own event has been released."""
    if _ACTIVITY:
        if e.activity_type() not in LAUNCH_TYPES:
            return None
        return Launch(corr, e.linked_correlation_id())
    linked = e.linked_correlation_id()   # older torch: only a Kineto activity (a runtime call) links to an op
    return Launch(corr, linked) if linked else None


def _is_task(e) -> bool:
    """A device event that is work on the device (kernel, copy, memset), not an annotation or a wait."""
    if _ACTIVITY:
        return e.activity_type() in TASK_TYPES
    return not (_USER_ANNOTATION and e.is_user_annotation())


# Kineto's clock is exact (ns); a backend-private kernel is listed in its operator's children by this label
KINETO = Reading(classify=_classify, details=_details, phase_of=_phase_from, per_us=1000.0,
                 private_label="{} (backend-private)", backward_sources=True)


try:   # the profiler's own enum: comparing to it is cheaper than formatting each event's device
    from torch._C._autograd import DeviceType as _DeviceType
    _CPU: Any = _DeviceType.CPU
except ImportError:  # pragma: no cover - a torch without the enum: told by its name, as before
    _CPU = None


def calls_from_kineto(events: list, step: int, table_entries: list, main_thread: int | None,
                      release: bool = False, memory: dict | None = None) -> list[OpCall]:
    """Build OpCalls for one step (the kineto adapter of ``opscope.parsers.calls``).

    ``release``: empty ``events`` once read, so that (with the profiler's results already
    dropped) each event's record is freed as soon as its call is built: the step's events and
    its calls are then not all in memory at once (capture peak memory, ``bench/scan_memory.py``).

    ``table_entries`` maps annotation ids ``opscope#N`` to (source, origin, kind, device, origin ids,
    library line).
    Backward ops get the source of the forward op with the same sequence number.

    ``memory``: when given, the step's allocator events, gradient marks and phase ranges are
    gathered into its lists ``memory``, ``marks`` and ``ranges`` (``capture/device_memory.py``);
    allocator events and memory marks are never calls.
    """
    threads: dict[int, list] = {}
    device = []
    for e in events:
        name = e.name()
        if name == MEMORY_EVENT or name.startswith(MEMORY_MARK):
            if memory is not None:
                if name == MEMORY_EVENT:
                    memory["memory"].append((e.start_ns(), e.nbytes()))
                else:
                    memory["marks"].append((e.start_ns(), name[len(MEMORY_MARK):]))
            continue
        kind = e.device_type()
        if kind == _CPU if _CPU is not None else str(kind).endswith("CPU"):
            tid = e.start_thread_id()
            corr = e.correlation_id()
            if "::" not in name:   # an operator or the profiler's bookkeeping is never a runtime call
                corr = launch_of(e, corr) or corr
            rec = (e.start_ns(), e.duration_ns(), name, e.sequence_nr(), corr, step, e)
            if memory is not None and is_phase_range(name):
                memory["ranges"].append((rec[0], rec[0] + rec[1], name))
            records = threads.get(tid)
            if records is None:
                threads[tid] = [rec]
            else:
                records.append(rec)
        elif _is_task(e):
            # its ids and duration now: its link to the operator that launched it is a weak reference
            device.append((e.correlation_id(), e.linked_correlation_id(), e.duration_ns()))
    if release:
        events.clear()   # the records hold what is still needed; each event is dropped once it is built
    builder = CallBuilder(KINETO, table_entries)
    for tid in sorted(threads):
        builder.add_thread(threads[tid], tid)
    builder.close()
    for correlation, linked, duration in device:   # device time to the operator that launched the task
        owner = builder.owner_of_device(correlation, linked)
        if owner is not None:
            builder.charge(owner, duration / 1000.0)
    return builder.finish()


def _shallow(value):
    """``freeze`` for the common depth: a list of scalars or of dimension lists (None stays None)."""
    if value is None:
        return None
    return tuple([tuple(v) if type(v) is list else v for v in value])


def _fold_key(c: OpCall, flat, children: tuple, origins: tuple) -> tuple:
    """(shapes, dtypes, scalars, key) of a call, its lists made hashable by ``flat``."""
    shapes, dtypes, scalars = flat(c.input_shapes), flat(c.dtypes), flat(c.scalars)
    return shapes, dtypes, scalars, (c.name, c.overload, shapes, dtypes, scalars, c.phase, c.parent, c.source,
                                     c.origin, c.origin_cause, c.device, c.thread, children, flat(c.output_shapes),
                                     origins, c.library)


_LAST_TOP = ("compact_calls", "last top-level call")
ORDER_STEPS, ORDER_CAP = 3, 20_000   # steps whose top-level order is kept (OpCall.order), places per step


def compact_calls(calls: list[OpCall], shared: dict | None = None) -> list[OpCall]:
    """Fold identical calls of one step into one record with ``count`` and summed times.

    A step that samples 500 tokens or evaluates an LBFGS closure 20 times repeats the same
    few hundred signatures at the same lines: keeping one record per call made capture
    memory grow with the length of the step.  Everything analysis reads (signature, line,
    origins, phase, parent, children) is part of the key, so nothing it uses is lost.
    ``shared`` (kept across steps) makes equal lists, strings and numbers of later steps the
    same objects, so a long scan does not hold one copy of each per step.
    """
    folded: dict[tuple, OpCall] = {}
    shared = {} if shared is None else shared
    # the last top-level call (kept in ``shared`` across steps: a step of one call in a loop re-runs the last
    # step's), and whether the current one re-ran it
    top_key, repeating = shared.get(_LAST_TOP), False
    place = 0   # the next top-level call's place in the step's sequence
    for c in calls:
        # two levels (a list of dimension lists) cover nearly every call; a deeper list (a TensorList's
        # shapes) is left unhashable by them, and then the whole value is frozen
        children, origins = tuple(c.children), tuple(sorted(c.origins)) if c.origins else ()
        shapes, dtypes, scalars, key = _fold_key(c, _shallow, children, origins)
        try:
            kept = folded.get(key)
        except TypeError:
            shapes, dtypes, scalars, key = _fold_key(c, freeze, children, origins)
            kept = folded.get(key)
        ordered = c.parent is None and c.step <= ORDER_STEPS and place < ORDER_CAP
        if c.parent is None:   # calls come parent first (by start): what follows a top-level call is inside it
            repeating, top_key = key == top_key, key
            place += 1
        if repeating:
            c.repeats = c.count
        if kept is not None:
            kept.count += c.count
            kept.repeats += c.repeats
            if ordered:
                kept.order.append(place - 1)
            kept.self_time_us += c.self_time_us
            kept.total_time_us += c.total_time_us
            kept.device_time_us += c.device_time_us
            continue
        folded[key] = c
        c.order = [place - 1] if ordered else []
        c.input_shapes = shared.setdefault(("s", shapes), c.input_shapes)
        c.dtypes = shared.setdefault(("d", dtypes), c.dtypes)
        c.scalars = shared.setdefault(("c", scalars), c.scalars)
        c.children = shared.setdefault(("k", children), c.children)
        c.origins = shared.setdefault(("o", origins), list(origins))
        for name in ("name", "phase", "parent", "source", "origin", "origin_cause", "device", "thread", "step",
                     "library"):
            value = getattr(c, name)
            if value is not None:
                setattr(c, name, shared.setdefault(value, value))
        c.seq_nr, c.start_us = -1, 0.0   # only needed while nesting this step's events
    shared[_LAST_TOP] = top_key
    return list(folded.values())
