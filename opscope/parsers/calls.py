"""The one event -> ``OpCall`` builder, for live profiler events and trace files alike.

Each source has an adapter that turns its events into one normalised record per host
event, a plain tuple (cheap: the live path runs once per captured step)::

    (start, duration, name, sequence nr, correlation id, step, *detail)

times in the source's unit (``Reading.per_us`` of them make a µs), ``detail`` whatever
the adapter's ``details`` needs to give an operator its (shapes, dtypes, scalars, source).
The adapter also says, as data (``Reading``), what its names mean (``classify``), which
names open a phase or a step, and how its clock nests ranges.  ``CallBuilder`` does the
rest the same way for every source: nesting per thread, the enclosing operator
(``parent``/``children``/self time), annotations (``opscope#N`` source table entries,
phase and step ranges), backend-private kernels folded into their public operator, device
time, and the ``device`` vocabulary documented on ``OpCall`` (``HOST``/``DEVICE`` here).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from opscope.model import DEVICE, HOST, HOST_BATCH, OpCall, Step

# what an event is, decided once per distinct name by the source's ``classify``
OPERATOR = 0    # a dispatcher operator: becomes an OpCall
PRIVATE = 1     # a backend's own kernel (mkldnn_*, aclnn*): its time belongs to the enclosing operator
MARK = 2        # a range that is no operator (annotation, runtime call): may open a phase or a step
TABLE = 3       # ``opscope#N``: the capture's source-table entry N applies inside it
MODE = 4        # a Python dispatch mode implementing the enclosing operator: what runs inside is its own


class Launch(NamedTuple):
    """The correlation slot of a host record that is a device launch (``cudaLaunchKernel``, ``cuLaunchKernelEx``,
    ``cudaMemcpyAsync``: a CUDA runtime or driver call), not a host range.

    Two id spaces never mix: ``correlation`` is the launch's own id in the device runtime's space (CUPTI's: the
    kernel, copy or memset it started carries the same one), ``linked`` the id of the host range that was open
    when it was called, in the host space every other record's correlation id is in (the trace's
    ``External id``; 0 or None when none was)."""
    correlation: Any
    linked: Any = None


@dataclass(frozen=True)
class Reading:
    """How one source's events are read (the only per-source part of building calls).

    The flags keep each source's established results (scan.json and diff output did not
    change when the two builders became this one): a trace's clock is rounded, and it lists
    a folded kernel's whole subtree among its operator's children, capture the kernel alone.
    """
    classify: Callable[[str], int]            # name -> OPERATOR | PRIVATE | MARK | TABLE | MODE
    details: Callable[[tuple], tuple]         # record -> (shapes, dtypes, scalars, source) of an operator
    phase_of: Callable[[str], str | None]     # the phase a MARK opens, if any
    step_of: Callable[[str], int | None] | None = None   # the step a MARK marks (trace files)
    per_us: float = 1.0
    # None: exact clock, a range is closed once the next event starts at or after its end;
    # a number: rounded clock, a range is closed once the next event ends past its end + eps
    eps: float | None = None
    private_label: str = "{}"                 # how a folded kernel is listed in its operator's children
    fold_all: bool = False                    # inside a folded kernel every event is the operator's detail
    fold_orphans: bool = True                 # a backend-private kernel outside any operator folds too
    backward_sources: bool = False            # backward ops take the source of their forward op (seq nr)
    fallback_child: Callable[[str], bool] | None = None   # a child that is evidence of a CPU fallback


class _KindCache(dict):
    """Record name -> its kind, each name classified once (on first lookup)."""

    def __init__(self, classify: Callable[[str], int]):
        super().__init__()
        self.classify = classify

    def __missing__(self, name: str) -> int:
        kind = self[name] = self.classify(name)
        return kind


class CallBuilder:
    """Feed each thread's records (``add_thread``), ``close``, charge device time (``charge``), ``finish``."""

    def __init__(self, reading: Reading, table: list | tuple = (), index_threads: bool = False):
        self.reading = reading
        self.table = table
        self.calls: list[OpCall] = []
        self.parent_of: list[int] = []            # call index -> its parent operator's index (-1: none)
        # host-space correlation id (the trace's External id) of a host range -> the operator it belongs to:
        # an operator's own, and an annotation's, a backend-private kernel's or a folded operator's (its owner)
        self.by_corr: dict = {}
        self.launch_owner: dict = {}              # device-space id of a launch inside an operator -> its index
        self.launch_link: dict = {}               # device-space id of a launch -> the host-space id it links to
        self.thread_index: dict | None = {} if index_threads else None  # thread -> (starts, ends, owners)
        self.windows: list = []                   # (start, end, step) of step ranges
        self.steps: dict[int, Step] = {}
        self.fallback: defaultdict[int, set] = defaultdict(set)  # call index -> fallback evidence names
        self._kinds = _KindCache(reading.classify)
        self._seq_source: dict[int, tuple] = {}
        self._pending_backward: list[tuple[OpCall, int]] = []

    def add_thread(self, records: list, thread: int, thread_key: Any = None,
                   default_phase: str | None = None) -> None:
        """Nest one thread's records (sorted here by start, longest first) into OpCalls.

        ``records`` is consumed: each is dropped once read, so what it holds (a live profiler
        event) can be freed while the rest of the step is built."""
        reading = self.reading
        kinds = self._kinds
        eps, fold_all = reading.eps, reading.fold_all
        table = self.table
        thread_index = self.thread_index
        starts: list = []
        ends: list = []
        owners: list = []
        records.sort(key=lambda r: (r[0], -r[1]))
        # each open range: (end, context its descendants inherit), the context being
        # (operator index or None, table entry, phase, step, backward seq nr, inside a folded kernel)
        stack: list[tuple] = []
        for i, rec in enumerate(records):
            records[i] = None   # consumed (see above)
            start, dur, name, corr = rec[0], rec[1], rec[2], rec[4]
            end = start + dur
            if eps is None:
                while stack and stack[-1][0] <= start:
                    stack.pop()
            else:
                while stack and end > stack[-1][0] + eps:
                    stack.pop()
            if stack:
                ctx = stack[-1][1]
                owner, ann, ph, step, bw_seq, folded = ctx
            else:
                owner, ann, ph, step, bw_seq, folded = None, None, default_phase, rec[5], None, False
                ctx = (owner, ann, ph, step, bw_seq, folded)
            kind = kinds[name]
            if fold_all and (folded or (kind == MARK and owner is not None)):
                kind = PRIVATE      # an annotation inside an operator is that operator's detail
            if kind == TABLE:
                try:
                    ann = table[int(name[8:])]
                except (ValueError, IndexError):
                    pass
                ctx = (owner, ann, ph, step, bw_seq, folded)
            elif kind == MODE:
                # only inside an operator: a mode's range may outlive the torch call that opened it
                # (a value read under a phase range), and what follows it is the job's work again
                ctx = (owner, ann, ph, step, bw_seq, folded or owner is not None)
            elif kind == MARK:
                ctx = self._enter_mark(rec, ctx)
            elif folded and not fold_all:
                # an operator inside a folded kernel: its time is already in the owner, and so is what it launches
                self._owns_launches(owner, corr)
            elif kind == PRIVATE:
                ctx = self._enter_private(name, corr, ctx)
            else:
                ctx = self._add_operator(rec, thread, ctx)
            stack.append((end, ctx))
            if thread_index is not None:
                starts.append(start)
                ends.append(end)
                owners.append(ctx[0])
        if thread_index is not None:
            thread_index[thread_key] = (starts, ends, owners)

    def _enter_mark(self, rec, ctx: tuple) -> tuple:
        """A mark range (a launch, a phase, a step): what it tells the ranges nested in it."""
        owner, ann, ph, step, bw_seq, folded = ctx
        start, dur, name, seq, corr = rec[0], rec[1], rec[2], rec[3], rec[4]
        reading = self.reading
        if corr is not None:
            if type(corr) is Launch:   # e.g. cudaLaunchKernel: its kernel is this op's
                if owner is not None:
                    self.launch_owner[corr.correlation] = owner
                if corr.linked:
                    self.launch_link[corr.correlation] = corr.linked
            elif owner is not None:    # an annotation inside an operator: what it launches is the op's
                self.by_corr[corr] = owner
        phase = reading.phase_of(name)
        if phase is not None:
            ph = phase
            if phase == "backward":
                bw_seq = seq
        step_of = reading.step_of
        if step_of is not None:
            step_no = step_of(name)
            if step_no is not None:
                step = step_no
                self.windows.append((start, start + dur, step_no))
                self.steps.setdefault(step_no, Step(index=step_no)).duration_us += dur / reading.per_us
        return (owner, ann, ph, step, bw_seq, folded)

    def _owns_launches(self, owner: int | None, corr) -> None:
        """What a range inside operator ``owner`` launches (its host-space id ``corr``) is the operator's."""
        if owner is not None and corr is not None:
            self.by_corr[corr] = owner

    def _enter_private(self, name: str, corr, ctx: tuple) -> tuple:
        """A backend-private kernel: a detail of the operator it runs in (its child, its launches)."""
        owner = ctx[0]
        reading = self.reading
        self._owns_launches(owner, corr)
        if owner is not None:
            children = self.calls[owner].children
            child = reading.private_label.format(name)
            if child not in children:
                children.append(child)
            if reading.fallback_child is not None and reading.fallback_child(name):
                self.fallback[owner].add(name)
        if owner is not None or reading.fold_orphans:
            return ctx[:5] + (True,)
        return ctx

    def _add_operator(self, rec, thread: int, ctx: tuple) -> tuple:
        """An operator range: a new OpCall, nested in its owner, its step and its backward's source."""
        owner, ann, ph, step, bw_seq, _ = ctx
        start, dur, name, seq, corr = rec[0], rec[1], rec[2], rec[3], rec[4]
        reading, calls = self.reading, self.calls
        per_us = reading.per_us
        phase = ph or "forward"
        if ann is not None and ann[3] == HOST_BATCH:
            phase = "other"     # host work whose result the script then moved to the device
        shapes, dtypes, scalars, source = reading.details(rec)
        op = OpCall(
            name=name, input_shapes=shapes, dtypes=dtypes, scalars=scalars,
            self_time_us=dur / per_us, total_time_us=dur / per_us, phase=phase,
            parent=calls[owner].name if owner is not None else None,
            source=ann[0] if ann else source,
            origin=ann[1] if ann else None,
            origin_cause=ann[2] if ann else None,
            device=ann[3] if ann else HOST,
            origins=list(ann[4]) if ann and len(ann) > 4 else [],
            library=ann[5] if ann and len(ann) > 5 else None,
            step=step or 0, thread=thread, seq_nr=seq, start_us=start / per_us)
        if owner is not None:
            parent = calls[owner]
            parent.self_time_us -= op.total_time_us
            if name not in parent.children:
                parent.children.append(name)
        if reading.backward_sources:
            if phase == "forward" and seq >= 0 and op.source:
                # ops that create no autograd node also record the *current* sequence number;
                # the node's creator is the last op recorded with it, so later ones win
                self._seq_source[seq] = (op.source, op.origin, op.origin_cause, op.device, op.origins, op.library)
            if phase == "backward" and bw_seq is not None:
                self._pending_backward.append((op, bw_seq))
        if corr is not None:
            self.by_corr[corr] = len(calls)
        self.parent_of.append(owner if owner is not None else -1)
        calls.append(op)
        if step and reading.step_of is not None:
            self.steps.setdefault(step, Step(index=step)).op_calls += 1
        return (len(calls) - 1, ann, ph, step, bw_seq, False)

    def owner_of_device(self, correlation, linked=None) -> int | None:
        """The operator that launched a device task (kernel, copy, memset), or None.

        ``correlation`` is the task's own id in the device runtime's space: the launch with the same id
        (a ``Launch`` record) was called in an operator, the one its host-space link names (the innermost
        range open when it was called) or else the one it nests in on its thread.  ``linked`` is the
        host-space id of the range the task itself links to (the trace's ``External id``), used when no
        launch has the task's id.  An id is looked up only among the ids of its own space."""
        by_corr = self.by_corr
        if correlation:
            via = self.launch_link.get(correlation)
            owner = by_corr.get(via) if via is not None else None
            if owner is None:
                owner = self.launch_owner.get(correlation)
            if owner is not None:
                return owner
        return by_corr.get(linked) if linked else None

    def close(self) -> None:
        """After the last thread: backward ops take the source of their forward op."""
        for op, seq in self._pending_backward:
            src = self._seq_source.get(seq)
            if src:  # a backward op belongs to the line of the forward op that created its node
                op.source, op.origin, op.origin_cause, op.device, op.origins, op.library = src
        self._pending_backward = []

    def charge(self, owner: int, duration_us: float) -> None:
        """Device time of a task launched by call ``owner`` (after ``close``): it ran on the device."""
        call = self.calls[owner]
        call.device_time_us += duration_us
        call.device = DEVICE

    def finish(self) -> list[OpCall]:
        """The calls, once charged: an operator with fallback evidence ran on the host."""
        for idx in self.fallback:
            self.calls[idx].device = HOST
        for op in self.calls:
            if op.self_time_us < 0:
                op.self_time_us = 0.0
        return self.calls
