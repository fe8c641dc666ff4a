"""Turn Chrome-trace events (torch, Kineto CUDA, Ascend) into a Profile.

This is the trace-file adapter of ``opscope.parsers.calls`` (whose builder live capture
uses too): it validates each event as it reads it into the builder's normalised record,
says as data how trace names read (``parsers/rules.yaml``: operators, backend-private
work such as ``mkldnn_*``, ``aclnn*``, TBE kernels and NPU runtime events, phase and step
annotations; a rounded clock), and charges device kernels to the operator that launched
them (via launch flows or correlation ids), with the collectives, copies and inserted
kernels only traces have.
"""
from __future__ import annotations

import bisect
import gc
from collections import Counter, defaultdict
from contextlib import contextmanager
from typing import Any

from opscope.model import Profile, freeze
from opscope.parsers.base import FormatError
from opscope.parsers.calls import MARK, OPERATOR, PRIVATE, CallBuilder, Reading
from opscope.parsers.device_steps import step_breakdown
from opscope.parsers.rules import rules as load_rules

HOST_CATEGORIES = {"cpu_op", "user_annotation", "Operator", "operator"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime"}
EPS = 0.01  # µs tolerance when nesting events whose times were rounded
_KEPT_PHASES = frozenset({"X", "s", "f", "M"})
_KINDS = {"op": OPERATOR, "private": PRIVATE, "annotation": MARK}   # rules.kind -> the builder's kinds


MAX_TIME_US = 1e18      # |ts| and dur in µs: 30,000 years; beyond is corruption, not a profile
MAX_NESTING = 8         # list depth of "Input Dims" / "Concrete Inputs" (torch writes at most 3)
MAX_INT = 2 ** 63


class _Clock:
    """Timestamps as floats relative to the first one seen.

    Ascend writes ``ts`` as a string of absolute µs (1.7e15): as a float that keeps
    only 0.25 µs, enough to break nesting, so the integer part is rebased first.
    Non-numbers and values out of range raise ValueError (the builder names the event).
    """

    def __init__(self):
        self.base = None

    def __call__(self, value) -> float:
        if isinstance(value, str):
            whole_text, _, frac = value.strip().partition(".")
            whole = int(whole_text or 0)
            if abs(whole) > MAX_TIME_US:
                raise ValueError(f"'ts' {value[:40]!r} is out of range")
            if self.base is None:
                self.base = whole
            return (whole - self.base) + (float("0." + frac) if frac.strip() else 0.0)
        if type(value) is not float or not -MAX_TIME_US <= value <= MAX_TIME_US:
            value = _number(value, "ts")
        if self.base is None:
            self.base = int(value)
        return value - self.base


def _number(value, key: str) -> float:
    """A finite time in µs from a JSON number (None counts as 0)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key!r} is {type(value).__name__} {str(value)[:40]!r}, expected a number")
    if not -MAX_TIME_US <= value <= MAX_TIME_US:   # also false for NaN
        raise ValueError(f"{key!r} is out of range")
    return float(value)


def _duration(value) -> float:
    if type(value) is float and 0.0 <= value <= MAX_TIME_US:
        return value
    if isinstance(value, str):  # Ascend writes some durations as strings
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"'dur' {value[:40]!r} is not a number") from None
    return max(_number(value, "dur"), 0.0)


def _ident(value):
    """pid / tid / correlation / flow ids: scalars only (they become dict keys)."""
    if value is None or isinstance(value, (int, str, float)):
        return value
    raise ValueError(f"an id is {type(value).__name__}, expected a number or a string")


def _text(value, key: str) -> str:
    if isinstance(value, str):
        return value
    raise ValueError(f"{key!r} is {type(value).__name__} {str(value)[:40]!r}, expected a string")


def _list(value):
    if value is None or isinstance(value, list):
        return value
    raise ValueError(f"'Concrete Inputs' is {type(value).__name__}, expected a list")


def _dim(text: str) -> int:
    value = int(text)
    if not -MAX_INT < value < MAX_INT:
        raise ValueError("a dimension in 'Input Dims' is out of range")
    return value


def _split_semicolons(text: str) -> list[str]:
    return [part.strip() for part in text.split(";")]



def _check_args(value) -> None:
    """An argument list as torch writes it: lists at most MAX_NESTING deep, no objects,
    integers in 64-bit range.  Iterative; run once per distinct list (on a cache miss)."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, list):
            if depth >= MAX_NESTING:
                raise ValueError(f"an argument list is nested deeper than {MAX_NESTING} levels")
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            raise ValueError("an argument list holds an object")
        elif isinstance(item, int) and not isinstance(item, bool) and not -MAX_INT < item < MAX_INT:
            raise ValueError("an argument list holds an integer out of range")


@contextmanager
def _gc_paused():
    """Loading creates millions of long-lived objects; the cyclic GC would rescan them
    over and over (it doubled the load time of a 100 MB trace) and none are cyclic."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class ProfileBuilder:
    """Feed events (``add``), once per file if a run is split in files; then ``build``.

    Only the fields the Profile needs are kept, and repeated values (names, shapes,
    dtype lists) are shared, so memory stays proportional to the operators, not to
    the trace text.
    """

    def __init__(self, source_format: str, path=None):
        self.rules = load_rules()
        self.source_format = source_format
        self.path = str(path) if path is not None else None
        self.clock = _Clock()
        # (pid, tid) -> records of opscope.parsers.calls: (ts, dur, name, seq, None, file_step,
        #                                                   shapes, dtypes, scalars, stack)
        self.host: dict[tuple, list] = defaultdict(list)
        self.maybe_kernels: list = []                           # (pid, tid, ts, dur, name, cat, corr, info)
        self.runtime: dict = {}                                 # correlation -> (pid, tid, ts)
        self.flow_start: dict = {}                              # id -> (pid, tid, ts)
        self.flow_end: dict = {}                                # (pid, tid, ts) -> id
        self.bwd_threads: set = set()
        self.fwd_threads: set = set()
        self.process_names: dict = {}
        self.process_labels: dict = {}
        self.thread_names: dict = {}
        self._shared: dict = {}
        self.header: dict = {}

    def _share(self, value):
        """One shared object per distinct value (names, shape lists, dtype lists)."""
        if value is None:
            return None
        if isinstance(value, str):
            key = value
        else:
            key = freeze(value)
        hit = self._shared.get(key)
        if hit is None:
            if not isinstance(value, str):
                _check_args(value)
            hit = self._shared[key] = value
        return hit

    # ------------------------------------------------------------------ intake
    def add(self, events, file_step: int | None = None) -> ProfileBuilder:
        with _gc_paused():
            self._add(events, file_step)
        return self

    # above complexity 15: per-event dispatch over every kind of trace event
    def _add(self, events, file_step):  # noqa: C901
        clock = self.clock
        share = self._share
        host = self.host
        host_cats = HOST_CATEGORIES
        kernel_cats = self.rules.device_kernel_categories
        flow_cats = self.rules.launch_flow_categories
        for index, ev in enumerate(events):
            try:
                ph = ev.get("ph")
                if ph not in _KEPT_PHASES:
                    continue
                cat = ev.get("cat")
                args = ev.get("args")
                if args is None:
                    args = {}
                elif not isinstance(args, dict):
                    raise ValueError(f"'args' is {type(args).__name__}, expected an object")
                pid, tid = ev.get("pid"), ev.get("tid")
                if type(pid) is not int or type(tid) is not int:   # the common case needs no check
                    pid, tid = _ident(pid), _ident(tid)
                if ph == "X":
                    if cat in host_cats:
                        dims = args.get("Input Dims")
                        stack = args.get("Call stack")
                        if stack is not None and not isinstance(stack, str) and not (
                                isinstance(stack, list) and all(isinstance(f, str) for f in stack)):
                            raise ValueError("'Call stack' is neither a string nor a list of strings")
                        seq = args.get("Sequence number", -1)
                        host[(pid, tid)].append(
                            (clock(ev.get("ts", 0)), _duration(ev.get("dur")),
                             share(_text(ev.get("name", ""), "name")),
                             int(seq) if isinstance(seq, int) else -1, None, file_step,
                             self._shapes(dims) if dims is not None else None,
                             self._dtypes(args.get("Input type")), share(_list(args.get("Concrete Inputs"))),
                             stack))
                    elif cat in RUNTIME_CATEGORIES:
                        corr = _ident(args.get("correlation"))
                        if corr is not None:
                            self.runtime[corr] = (pid, tid, clock(ev.get("ts", 0)))
                    elif cat is None or cat in kernel_cats:
                        self.maybe_kernels.append((pid, tid, clock(ev.get("ts", 0)), _duration(ev.get("dur")),
                                                   share(_text(ev.get("name", ""), "name")), cat,
                                                   _ident(args.get("correlation")), _task_info(args, share)))
                elif ph in ("s", "f"):
                    if cat in flow_cats:
                        key = (cat, _ident(ev.get("id")))
                        point = (pid, tid, clock(ev.get("ts", 0)))
                        if ph == "s":
                            self.flow_start[key] = point
                        else:
                            self.flow_end[point] = key
                    elif cat == "fwdbwd":
                        (self.bwd_threads if ph == "f" else self.fwd_threads).add((pid, tid))
                else:  # "M": process metadata
                    name = ev.get("name")
                    if name == "process_name":
                        value = args.get("name")
                        self.process_names[pid] = value if isinstance(value, str) else None
                    elif name == "process_labels":
                        self.process_labels[pid] = args.get("labels")
                    elif name == "thread_name":
                        value = args.get("name")
                        self.thread_names[(pid, tid)] = value if isinstance(value, str) else None
            except FormatError:
                raise
            except RecursionError:
                raise FormatError(f"an argument list is nested deeper than {MAX_NESTING} levels",
                                  where=f"event {index}") from None
            except (TypeError, ValueError, AttributeError, OverflowError) as exc:
                raise FormatError(f"malformed event ({exc})", where=f"event {index}") from None

    # ------------------------------------------------------------------ parsing helpers
    def _shapes(self, raw):
        if isinstance(raw, str):       # Ascend: "32,3,224,224;\r\n64,3,11,11;\r\n..."
            cached = self._shared.get(("dims", raw))
            if cached is None:
                cached = [[_dim(x) for x in p.split(",") if x.strip().lstrip("-").isdigit()]
                          for p in _split_semicolons(raw)]
                self._shared[("dims", raw)] = cached
            return cached
        if not isinstance(raw, list):
            raise ValueError(f"'Input Dims' is {type(raw).__name__}, expected a list or a string")
        return self._share(raw)

    def _dtypes(self, raw):
        if isinstance(raw, str):
            cached = self._shared.get(("types", raw))
            if cached is None:
                cached = self._shared[("types", raw)] = ["" if p == "None" else p for p in _split_semicolons(raw)]
            return cached
        if raw is None:
            return None
        if not isinstance(raw, list):
            raise ValueError("'Input type' is neither a string nor a list of strings")
        key = freeze(raw)
        hit = self._shared.get(key)
        if hit is None:   # checked once per distinct list, not once per event
            if not all(t is None or type(t) is str for t in raw):
                raise ValueError("'Input type' holds something other than strings")
            hit = self._shared[key] = raw
        return hit

    def _details(self, rec: tuple) -> tuple:
        """(shapes, dtypes, scalars, source) of an operator's record."""
        shapes, dtypes, scalars, call_stack = rec[6], rec[7], rec[8], rec[9]
        shapes = shapes if shapes is not None else []
        dtypes = dtypes if dtypes is not None else []
        if len(shapes) > len(dtypes) and not any(shapes[len(dtypes):]):
            shapes = shapes[:len(dtypes)]   # Ascend terminates each entry with ';'
        return shapes, dtypes, scalars or [], self._source(call_stack) if call_stack else None

    @staticmethod
    def _source(stack) -> str | None:
        if not stack:
            return None
        frames = stack.split(";") if isinstance(stack, str) else list(stack)
        for frame in frames:
            frame = frame.strip()
            if not frame or "site-packages" in frame or "/lib/python" in frame or frame.startswith("<"):
                continue
            path, _, rest = frame.partition("(")
            line = rest.partition(")")[0]
            return f"{path.rsplit('/', 1)[-1]}:{line}" if line else path
        return None

    # ------------------------------------------------------------------ build
    def build(self) -> Profile:
        with _gc_paused():
            return self._build()

    # above complexity 15: assembles the profile from every trace table in one pass
    def _build(self) -> Profile:  # noqa: C901
        rules = self.rules
        device_pids = {pid for pid, name in self.process_names.items() if name in rules.device_processes}
        # collectives (HCCL "Group N Communication"); their "Plane N" sub-tasks are details
        comm_threads = {t for t, name in self.thread_names.items()
                        if self.process_names.get(t[0]) in rules.communication_processes
                        and rules.communication_thread(name) == "collective"}
        kernels = [k for k in self.maybe_kernels
                   if k[0] in device_pids or (k[0], k[1]) in comm_threads
                   or (k[5] is not None and k[5] in rules.device_kernel_categories)]
        self.maybe_kernels = []
        device = "npu" if device_pids else ("cuda" if kernels else "cpu")

        reading = Reading(classify=lambda name: _KINDS[rules.kind(name)], details=self._details,
                          phase_of=rules.phase_of_annotation, step_of=rules.step_of_annotation, eps=EPS,
                          fold_all=True, fold_orphans=False,
                          fallback_child=rules.is_fallback_child if device != "cpu" else None)
        builder = CallBuilder(reading, index_threads=True)
        for thread in list(self.host):
            default_phase = ("backward" if thread in self.bwd_threads and thread not in self.fwd_threads
                             else "forward")
            builder.add_thread(self.host.pop(thread), thread[1] if isinstance(thread[1], int) else 0,
                               thread_key=thread, default_phase=default_phase)
        builder.close()
        calls, steps, windows = builder.calls, builder.steps, builder.windows
        _steps_by_time(calls, windows, steps)
        unattributed, inserted, tasks, collectives, copies = self._attach_kernels(
            kernels, builder, comm_threads, windows)
        builder.finish()
        device_steps = step_breakdown(tasks, {w[2]: (w[0], w[1]) for w in windows}) if tasks else []
        prof = Profile(calls=calls, steps=[steps[k] for k in sorted(steps)], device=device,
                       source_format=self.source_format, path=self.path)
        prof.metadata.update({
            "has_phases": True,
            "device_kernels": len(kernels),
            "device_time_unattributed_us": round(unattributed, 3),
            "inserted_kernels": inserted,
            "clock_base_us": self.clock.base,
            "device_steps": device_steps,
            "collectives": collectives,
            "transfer_calls": _transfer_chains(copies, calls, builder.parent_of, rules),
            "fallback_evidence": [{"op": calls[i].name, "evidence": sorted(n), "step": calls[i].step}
                                  for i, n in sorted(builder.fallback.items())],
        })
        return prof

    def _launch_point(self, kernel):
        pid, tid, ts, _dur, _name, _cat, corr, _info = kernel
        key = self.flow_end.get((pid, tid, ts))
        if key is not None and key in self.flow_start:
            return self.flow_start[key]
        if corr is not None and corr in self.runtime:
            return self.runtime[corr]
        return None

    def _owner_of(self, kernel, thread_index):
        point = self._launch_point(kernel)
        if point is None or (point[0], point[1]) not in thread_index:
            return None
        starts, ends, owners = thread_index[(point[0], point[1])]
        i = bisect.bisect_right(starts, point[2] + EPS) - 1
        # the innermost event containing the launch is the latest-starting one still open
        while i >= 0 and ends[i] + EPS < point[2]:
            i -= 1
        return owners[i] if i >= 0 else None

    def _attach_kernels(self, kernels, builder: CallBuilder, comm_threads, windows):
        """Charge each device task to the operator that launched it: launch flows first,
        then time containment (a collective's sub-tasks on the communication stream lie
        inside it).  Compute, communication and copy tasks count as the operator's device
        time; stream bookkeeping (event record/wait) and collective sub-tasks do not.
        Returns (unattributed µs, NPU-inserted kernels, per-step tasks, collectives)."""
        rules = self.rules
        calls, thread_index = builder.calls, builder.thread_index
        unattributed = 0.0
        inserted: defaultdict[str, dict[str, Any]] = defaultdict(lambda: {"calls": 0, "device_time_us": 0.0,
                                                                           "ops": Counter()})
        classified = []
        for kernel in kernels:
            pid, tid, ts, dur, name, cat, _corr, info = kernel
            klass = ("communication" if (pid, tid) in comm_threads
                     else rules.task_class(name, info[0] if info else None, cat))
            classified.append((kernel, klass, self._owner_of(kernel, thread_index)))
        spans = sorted((k[2], k[2] + k[3], owner) for k, klass, owner in classified
                       if klass == "communication" and owner is not None)
        span_starts = [s[0] for s in spans]
        step_windows = sorted(windows)
        window_starts = [w[0] for w in step_windows]
        tasks: list = []
        collectives: list = []
        copies: dict = {}
        for kernel, klass, owner in classified:
            pid, tid, ts, dur, name, cat, _corr, info = kernel
            if owner is None and klass in ("comm-subtask", "communication") and spans:
                i = bisect.bisect_right(span_starts, ts + EPS) - 1
                if i >= 0 and ts <= spans[i][1] + EPS:
                    owner = spans[i][2]
            if klass in ("sync", "comm-subtask"):
                continue
            if owner is None:
                unattributed += dur
            else:
                builder.charge(owner, dur)
            step = calls[owner].step if owner is not None else 0
            if not step and step_windows:
                i = bisect.bisect_right(window_starts, ts) - 1
                step = step_windows[i][2] if i >= 0 and ts <= step_windows[i][1] else 0
            tasks.append((ts, ts + dur, klass, step))
            if klass == "transfer" and owner is not None:
                certain = rules.is_host_transfer(name, info[0] if info else None)
                if certain is not False:
                    copies[owner] = copies.get(owner) or certain
            if klass == "communication":
                count, dtype = (info[1], info[2]) if info else (None, None)
                collectives.append({
                    "name": _collective_type(name), "kernel": name,
                    "op": calls[owner].name if owner is not None else None, "step": step,
                    "start_us": round((self.clock.base or 0) + ts, 3), "duration_us": round(dur, 3),
                    "count": count, "data_type": dtype, "bytes": _bytes(count, dtype)})
            if rules.is_inserted_kernel(name):
                entry = inserted[rules.kernel_type(name)]
                entry["calls"] += 1
                entry["device_time_us"] += dur
                entry["ops"][calls[owner].name if owner is not None else "(unattributed)"] += 1
        inserted_list = [{"kernel": k, "calls": v["calls"], "device_time_us": round(v["device_time_us"], 3),
                          "ops": dict(v["ops"].most_common())} for k, v in sorted(inserted.items())]
        collectives.sort(key=lambda c: c["start_us"])
        return unattributed, inserted_list, tasks, collectives, copies


def _transfer_chains(copies, calls, parent_of, rules) -> list[int]:
    """Indices of the calls that moved data between host and device: each transfer
    operator that launched a host<->device copy task, with its ancestors that are the same transfer
    (``aten::to`` -> ``aten::_to_copy`` -> ``aten::copy_``; ``transfer_ops`` in the rules)."""
    marked = set()
    for idx, certain in copies.items():
        chain = []
        while idx >= 0 and idx not in marked and rules.is_transfer_op(calls[idx].name):
            chain.append(idx)
            idx = parent_of[idx]
        # a copy task that may be device to device counts only under a .to() (aten::_to_copy)
        if certain or any(calls[i].name in rules.to_copy_ops for i in chain):
            marked.update(chain)
    return sorted(marked)


_DTYPE_BYTES = {"FP32": 4, "FLOAT": 4, "FP16": 2, "BF16": 2, "INT8": 1, "UINT8": 1, "INT16": 2, "INT32": 4,
                "INT64": 8, "FP64": 8, "DOUBLE": 8}


def _task_info(args: dict, share):
    """(task type, element count, data type) of a device task, or None when it has none."""
    task_type, count, dtype = args.get("Task Type"), args.get("count"), args.get("data_type")
    task_type = task_type if isinstance(task_type, str) else None
    dtype = dtype if isinstance(dtype, str) else None
    count = count if isinstance(count, (int, float)) and not isinstance(count, bool) and count >= 0 else None
    if task_type is None and count is None and dtype is None:
        return None
    return share(task_type), count, share(dtype)


def _bytes(count, dtype):
    size = _DTYPE_BYTES.get(str(dtype).upper()) if dtype else None
    return int(count * size) if count is not None and size else None


def _collective_type(name: str) -> str:
    """'hcom_allReduce__586_0_1' -> 'hcom_allReduce_' (kernel_details.csv's Type)."""
    base = name
    while True:
        head, sep, tail = base.rpartition("_")
        if sep and tail.isdigit() and head:
            base = head
        else:
            return base


def _steps_by_time(calls, windows, steps) -> None:
    """Give calls on other threads (autograd workers) the step whose marker spans them."""
    if not windows:
        return
    windows.sort()
    starts = [w[0] for w in windows]
    for call in calls:
        if call.step:
            continue
        i = bisect.bisect_right(starts, call.start_us) - 1
        if i >= 0 and call.start_us <= windows[i][1]:
            call.step = windows[i][2]
            steps[call.step].op_calls += 1
