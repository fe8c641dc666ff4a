"""Turn raw profiler (Kineto) events of one step into ``OpCall`` records.

We read ``prof.profiler.kineto_results.events()`` directly instead of
``prof.events()``/``key_averages()``: it is several times faster and keeps what we
need (shapes, dtypes, concrete scalars, sequence numbers).  Nesting is rebuilt per
thread from timestamps, like the profiler's own FunctionEvent tree.
"""
from __future__ import annotations

from opscope.knowledge import is_backend_private
from opscope.model import HOST_BATCH, OpCall, freeze

BOOKKEEPING_PREFIXES = ("profiler::", "autograd::engine::", "torch::autograd::", "ProfilerStep#")


def is_operator(name: str) -> bool:
    """ATen and other dispatcher ops (``ns::op``); not profiler bookkeeping or annotations."""
    return "::" in name and not name.startswith(BOOKKEEPING_PREFIXES) and " " not in name.split("::", 1)[0]


def _jsonable(value):
    if isinstance(value, list):
        return [v if isinstance(v, (int, float, str, bool)) or v is None else _jsonable(v) for v in value]
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


# above complexity 15: per-event dispatch over every kind of profiler event
def calls_from_kineto(events, step: int, table_entries: list, main_thread: int | None) -> list[OpCall]:  # noqa: C901
    """Build OpCalls for one step.

    ``table_entries`` maps annotation ids ``opscope#N`` to (source, origin, kind, device, origin ids,
    library line).
    Backward ops get the source of the forward op with the same sequence number.
    """
    cpu, device = [], []
    for e in events:
        if str(e.device_type()).endswith("CPU"):
            cpu.append(e)
        else:
            device.append(e)
    cpu.sort(key=lambda e: (e.start_thread_id(), e.start_ns(), -e.duration_ns()))
    calls: list[OpCall] = []
    by_corr: dict[int, OpCall] = {}
    seq_source: dict[int, tuple] = {}
    # Each open range carries the context its descendants inherit, so looking up the
    # enclosing op/annotation/phase is O(1): (end_ns, parent op, annotation, phase,
    # backward sequence number, inside a backend-private kernel)
    root = (None, None, None, None, False)
    stack: list[tuple] = []
    thread = None
    pending_backward: list[tuple[OpCall, int]] = []
    launch_owner: dict[int, OpCall] = {}
    for e in cpu:
        tid = e.start_thread_id()
        if tid != thread:
            stack.clear()
            thread = tid
        start = e.start_ns()
        dur = e.duration_ns()
        end = start + dur
        while stack and stack[-1][0] <= start:
            stack.pop()
        parent_op, ann, ph, bw_seq, private = stack[-1][1] if stack else root
        name = e.name()
        if name.startswith("opscope#"):
            try:
                ann = table_entries[int(name[8:])]
            except (ValueError, IndexError):
                pass
            stack.append((end, (parent_op, ann, ph, bw_seq, private)))
            continue
        if name == "PythonDispatchMode":
            # a Python dispatch mode (--mode fake's fake tensors) implementing the enclosing operator: what
            # it runs inside is its own bookkeeping, not operators of the job.  Only inside an operator:
            # a mode's range may outlive the torch call that opened it (a value read under a phase range),
            # and what follows it is the job's work again
            stack.append((end, (parent_op, ann, ph, bw_seq, private or parent_op is not None)))
            continue
        if not is_operator(name):
            if parent_op is not None:  # e.g. cudaLaunchKernel: its kernel belongs to this op
                launch_owner[e.correlation_id()] = parent_op
            phase = _phase_from(name)
            if phase is not None:
                ph = phase
                if phase == "backward":
                    bw_seq = e.sequence_nr()
            stack.append((end, (parent_op, ann, ph, bw_seq, private)))
            continue
        if private:
            # inside a backend-private kernel: its time is already in the public ancestor
            stack.append((end, (parent_op, ann, ph, bw_seq, True)))
            continue
        if is_backend_private(name):
            if parent_op is not None:
                label = f"{name} (backend-private)"
                if label not in parent_op.children:
                    parent_op.children.append(label)
            stack.append((end, (parent_op, ann, ph, bw_seq, True)))
            continue
        phase = ph or "forward"
        host_batch = ann is not None and ann[3] == HOST_BATCH
        if host_batch:   # host work whose result the script then moved to the device: data preparation
            phase = "other"
        seq_nr = e.sequence_nr()
        op = OpCall(
            name=name,
            input_shapes=_jsonable(e.shapes()),
            dtypes=list(e.dtypes()),
            scalars=_jsonable(e.concrete_inputs()),
            self_time_us=dur / 1000.0,
            total_time_us=dur / 1000.0,
            phase=phase,
            parent=parent_op.name if parent_op is not None else None,
            source=ann[0] if ann else None,
            origin=ann[1] if ann else None,
            origin_cause=ann[2] if ann else None,
            device=ann[3] if ann else "host",
            origins=list(ann[4]) if ann and len(ann) > 4 else [],
            library=ann[5] if ann and len(ann) > 5 else None,
            step=step,
            thread=tid,
            seq_nr=seq_nr,
            start_us=start / 1000.0,
        )
        if parent_op is not None:
            parent_op.self_time_us -= op.total_time_us
            if name not in parent_op.children:
                parent_op.children.append(name)
        if phase == "forward" and seq_nr >= 0 and op.source:
            # ops that create no autograd node also record the *current* sequence number;
            # the node's creator is the last op recorded with it, so later ones win
            seq_source[seq_nr] = (op.source, op.origin, op.origin_cause, op.device, op.origins, op.library)
        if phase == "backward" and bw_seq is not None:
            pending_backward.append((op, bw_seq))
        calls.append(op)
        by_corr[e.correlation_id()] = op
        stack.append((end, (op, ann, ph, bw_seq, False)))
    for op, seq in pending_backward:
        src = seq_source.get(seq)
        if src:  # a backward op belongs to the line of the forward op that created its node
            op.source, op.origin, op.origin_cause, op.device, op.origins, op.library = src
    _attach_device_time(device, by_corr, launch_owner)
    for op in calls:
        op.self_time_us = max(op.self_time_us, 0.0)
    return calls


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
    for c in calls:
        shapes, dtypes, scalars = freeze(c.input_shapes), freeze(c.dtypes), freeze(c.scalars)
        children, origins = tuple(c.children), tuple(sorted(c.origins or ()))
        key = (c.name, c.overload, shapes, dtypes, scalars, c.phase, c.parent, c.source, c.origin,
               c.origin_cause, c.device, c.thread, children, freeze(c.output_shapes), origins, c.library)
        kept = folded.get(key)
        if kept is not None:
            kept.count += c.count
            kept.self_time_us += c.self_time_us
            kept.total_time_us += c.total_time_us
            kept.device_time_us += c.device_time_us
            continue
        folded[key] = c
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
    return list(folded.values())



def _attach_device_time(device_events, by_corr: dict, launch_owner: dict) -> None:
    """Add kernel time to the op that launched it (runtime launch -> enclosing op)."""
    for k in device_events:
        owner = launch_owner.get(k.linked_correlation_id()) or by_corr.get(k.linked_correlation_id())
        if owner is not None:
            owner.device_time_us += k.duration_ns() / 1000.0
            owner.device = "device"
