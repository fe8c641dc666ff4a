"""Ascend PyTorch profiler SQLite export (``ascend_pytorch_profiler_*.db``), read with ``sqlite3``.

Newer torch_npu writes this by default (``export_type=db``); msprof-analyze's cluster
recipes need it.  Its tables join simply, and are turned into the same events the text
export's ``trace_view.json`` holds, then built by the common ``ProfileBuilder`` - so
nesting, folding, kernel attribution, communication and step split are the same code:

- ``PYTORCH_API`` (type ``op``): host operators and ``ProfilerStep#N`` (names, shapes and
  dtypes via ``STRING_IDS``, call stacks via ``PYTORCH_CALLCHAINS``);
- ``CONNECTION_IDS`` + ``connectionCats``: the ``async_npu`` launch links (operator ->
  device task) and the ``fwdbwd`` links (forward -> autograd thread);
- ``TASK`` (+ ``COMPUTE_TASK_INFO`` / ``COMMUNICATION_TASK_INFO`` for names): device tasks,
  classed by their ``taskType``;
- ``COMMUNICATION_OP``: one row per collective (name, count, data type), the HCCL
  "Group Communication" events of the text export.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

HOST_PID, DEVICE_PID, HCCL_PID = "host", "npu-hw", "hccl"
OP_API_TYPE = "op"


def _ts(ns) -> str:
    """Absolute ns -> the text export's µs string (keeps ns precision)."""
    ns = int(ns)
    return f"{ns // 1000}.{ns % 1000:03d}"


def _looks_like_dims(text: str | None) -> bool:
    if not text:
        return False
    return any(ch.isdigit() for ch in text) and not any(ch.isalpha() for ch in text)


def find_db(path: Path) -> Path | None:
    """The profiler database of a rank folder (``ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_*.db``)."""
    path = Path(path)
    if path.is_file():
        return path
    out = path / "ASCEND_PROFILER_OUTPUT" if (path / "ASCEND_PROFILER_OUTPUT").is_dir() else path
    found = sorted(out.glob("ascend_pytorch_profiler*.db"))
    return found[0] if found else None


def db_events(db_path):
    """Yield trace_view-style events from one rank's profiler database."""
    con = sqlite3.connect(f"file:{Path(db_path)}?mode=ro", uri=True)
    try:
        yield from _events(con)
    finally:
        con.close()


@dataclass
class _Tables:
    """The small lookup tables every pass over the big ones reads: loaded once per database."""
    names: set                  # the tables this export has
    strings: dict               # STRING_IDS: id -> text
    api_types: dict             # ENUM_API_TYPE: id -> name
    all_launch: bool            # no connectionCats (older/level-0 exports): every link is a launch link
    cats: dict[int, set]        # connection -> its categories (async_npu, fwdbwd)
    links: dict[int, list]      # CONNECTION_IDS: id -> connections
    stacks: dict[int, list]     # PYTORCH_CALLCHAINS: id -> [(depth, frame)]


@dataclass
class _QueueLinks:
    """What the host pass gathers for tasks launched from the task-queue thread."""
    linked: set = field(default_factory=set)       # connection ids an operator row launches directly
    enqueued: dict = field(default_factory=dict)   # task-queue connection -> (tid, ts) of its Enqueue
    dequeues: dict = field(default_factory=dict)   # tid -> [(start, end, connections)] of Dequeue rows


def _events(con):
    """Every table in the text export's event form, one table after the other (one event builder: issue 21)."""
    t = _lookup_tables(con)
    yield {"ph": "M", "name": "process_name", "pid": DEVICE_PID, "args": {"name": "Ascend Hardware"}}
    yield {"ph": "M", "name": "process_name", "pid": HCCL_PID, "args": {"name": "HCCL"}}
    yield {"ph": "M", "name": "thread_name", "pid": HCCL_PID, "tid": 0, "args": {"name": "Group 0 Communication"}}
    queue = _QueueLinks()
    yield from _host_events(con, t, queue)
    queued = _queued_launches(con, t, queue)
    for conn, (tid, ts) in queued.items():
        yield {"ph": "s", "cat": "async_npu", "id": f"q{conn}", "pid": HOST_PID, "tid": tid, "ts": ts}
    yield from _device_events(con, t, queued)
    if "COMMUNICATION_OP" in t.names:
        yield from _collective_events(con, t)


def _lookup_tables(con) -> _Tables:
    """Strings, API types, link categories, links and call stacks, each read whole (they are small)."""
    strings = dict(con.execute("SELECT id, value FROM STRING_IDS"))
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    api_types = dict(con.execute("SELECT id, name FROM ENUM_API_TYPE")) if "ENUM_API_TYPE" in names else {}
    cats: dict[int, set] = {}
    all_launch = "connectionCats" not in names
    if not all_launch:
        for conn, cat in con.execute("SELECT connectionId, cat FROM connectionCats"):
            cats.setdefault(conn, set()).add(cat)
    links: dict[int, list] = {}
    if "CONNECTION_IDS" in names:
        for cid, conn in con.execute("SELECT id, connectionId FROM CONNECTION_IDS"):
            links.setdefault(cid, []).append(conn)
    stacks: dict[int, list] = {}
    if "PYTORCH_CALLCHAINS" in names:
        for cid, frame, depth in con.execute("SELECT id, stack, stackDepth FROM PYTORCH_CALLCHAINS"):
            stacks.setdefault(cid, []).append((depth, strings.get(frame, "")))
    return _Tables(names=names, strings=strings, api_types=api_types, all_launch=all_launch, cats=cats,
                   links=links, stacks=stacks)


def _host_events(con, t: _Tables, queue: _QueueLinks):
    """Host operators (``PYTORCH_API``) with their launch and fwdbwd links; the task queue's Enqueue and
    Dequeue rows go to ``queue`` instead.  One pass over the largest table: the row loop stays inline."""
    strings, api_types, links, cats, stacks = t.strings, t.api_types, t.links, t.cats, t.stacks
    all_launch = t.all_launch
    # some exports swap the shapes/dtypes columns: tell them apart by content
    rows = con.execute("SELECT startNs, endNs, globalTid, connectionId, name, sequenceNumber, inputDtypes, "
                       "inputShapes, callchainId, type FROM PYTORCH_API ORDER BY CAST(startNs AS INTEGER)").fetchall()
    swapped = _columns_swapped(rows, strings)
    if all_launch:
        yield from _autograd_workers(rows, strings)
    fwdbwd_seen: dict[int, bool] = {}
    linked, enqueued, dequeues = queue.linked, queue.enqueued, queue.dequeues
    for start, end, tid, conn_id, name, seq, dtypes, shapes, chain, api_type in rows:
        if api_types.get(api_type, OP_API_TYPE) != OP_API_TYPE:
            label = strings.get(name, "")
            conns = links.get(conn_id, ()) if conn_id is not None else ()
            if label.startswith("Enqueue"):
                for conn in conns:
                    enqueued[conn] = (tid, _ts(start))
            elif label.startswith("Dequeue"):
                dequeues.setdefault(tid, []).append((int(start), int(end), conns))
            continue
        start, end = int(start), int(end)
        if swapped:
            dtypes, shapes = shapes, dtypes
        args = {}
        if shapes is not None or dtypes is not None:     # the text export writes '' for 0-dim inputs
            args["Input Dims"] = strings.get(shapes, "") if shapes is not None else ""
        if dtypes is not None:
            args["Input type"] = strings.get(dtypes, "")
        if seq is not None:
            args["Sequence number"] = seq
        if chain is not None and chain in stacks:
            args["Call stack"] = ";".join(frame for _d, frame in sorted(stacks[chain]))
        ts = _ts(start)
        yield {"ph": "X", "cat": "cpu_op", "name": strings.get(name, str(name)), "pid": HOST_PID, "tid": tid,
               "ts": ts, "dur": (end - start) / 1000.0, "args": args}
        for conn in links.get(conn_id, ()) if conn_id is not None else ():
            linked.add(conn)
            kinds = cats.get(conn, ())
            if all_launch or "async_npu" in kinds:
                yield {"ph": "s", "cat": "async_npu", "id": conn, "pid": HOST_PID, "tid": tid, "ts": ts}
            if "fwdbwd" in kinds:            # first end of the link is the forward op, second the backward
                first = conn not in fwdbwd_seen
                fwdbwd_seen[conn] = True
                yield {"ph": "s" if first else "f", "cat": "fwdbwd", "id": conn, "pid": HOST_PID, "tid": tid,
                       "ts": ts}


def _autograd_workers(rows: list, strings: dict):
    """Without fwdbwd links, mark the autograd workers: a thread running autograd functions that is not the
    one holding ProfilerStep (as the fwdbwd flows show in the text export)."""
    main = {r[2] for r in rows if strings.get(r[4], "").startswith("ProfilerStep#")}
    workers = {r[2] for r in rows if strings.get(r[4], "").startswith("autograd::engine::evaluate_function")}
    for tid in sorted(workers - main):
        yield {"ph": "f", "cat": "fwdbwd", "id": f"worker-{tid}", "pid": HOST_PID, "tid": tid, "ts": "0"}


def _queued_launches(con, t: _Tables, queue: _QueueLinks) -> dict:
    """Tasks launched from the task-queue thread (H2D copies, ...) -> the (tid, ts) to link them from: the
    launch (CANN_API) lies in a Dequeue whose Enqueue is inside the operator that asked for it."""
    queued: dict = {}
    dequeues = queue.dequeues
    if not dequeues or "CANN_API" not in t.names:
        return queued
    for spans in dequeues.values():
        spans.sort(key=lambda x: x[0])
    for conn, tid, start in con.execute("SELECT connectionId, globalTid, startNs FROM CANN_API"):
        if conn in queue.linked or tid not in dequeues:
            continue
        for d_start, d_end, d_conns in dequeues[tid]:
            if d_start <= int(start) <= d_end:
                point = next((queue.enqueued[c] for c in d_conns if c in queue.enqueued), None)
                if point:
                    queued[conn] = point
                break
            if d_start > int(start):
                break
    return queued


def _device_events(con, t: _Tables, queued: dict):
    """Device tasks (``TASK``) and their launch links: names from COMPUTE_TASK_INFO, classes from the task
    type (a communication sub-task is named by its task type, as in trace_view.json: its
    COMMUNICATION_TASK_INFO name is the collective's, which would count it twice)."""
    from opscope.parsers.rules import rules as load_rules

    strings, cats, all_launch = t.strings, t.cats, t.all_launch
    names = {}
    if "COMPUTE_TASK_INFO" in t.names:
        names.update(con.execute("SELECT globalTaskId, name FROM COMPUTE_TASK_INFO"))
    task_class = load_rules().task_class
    for start, end, conn, gid, task_type, stream in con.execute(
            "SELECT startNs, endNs, connectionId, globalTaskId, taskType, streamId FROM TASK"):
        kind = strings.get(task_type, str(task_type))
        if gid not in names and task_class(kind, kind, None) == "compute":
            # a kernel-typed task without COMPUTE_TASK_INFO is a scheduling wrapper (a
            # collective's task on the communication stream, a mix kernel's partner):
            # msprof-analyze's kernel_details and Computing leave it out too
            continue
        name = strings.get(names[gid], kind) if gid in names else kind
        ts = _ts(start)
        yield {"ph": "X", "name": name, "pid": DEVICE_PID, "tid": stream, "ts": ts, "dur": (int(end) - int(start)) / 1000.0,
               "args": {"Task Type": kind, "connection_id": conn}}
        if conn in queued:
            yield {"ph": "f", "cat": "async_npu", "id": f"q{conn}", "pid": DEVICE_PID, "tid": stream, "ts": ts}
        elif conn is not None and (all_launch or "async_npu" in cats.get(conn, ())):
            yield {"ph": "f", "cat": "async_npu", "id": conn, "pid": DEVICE_PID, "tid": stream, "ts": ts}


def _collective_events(con, t: _Tables):
    """One HCCL event per collective (``COMMUNICATION_OP``), the text export's "Group Communication" row."""
    strings = t.strings
    dtypes = dict(con.execute("SELECT id, name FROM ENUM_HCCL_DATA_TYPE")) if "ENUM_HCCL_DATA_TYPE" in t.names else {}
    for name, start, end, conn, dtype, count in con.execute(
            "SELECT opName, startNs, endNs, connectionId, dataType, count FROM COMMUNICATION_OP"):
        ts = _ts(start)
        yield {"ph": "X", "name": strings.get(name, str(name)), "pid": HCCL_PID, "tid": 0, "ts": ts,
               "dur": (int(end) - int(start)) / 1000.0,
               "args": {"connection_id": conn, "data_type": dtypes.get(dtype), "count": count}}
        if conn is not None:
            yield {"ph": "f", "cat": "async_npu", "id": conn, "pid": HCCL_PID, "tid": 0, "ts": ts}


def _columns_swapped(rows, strings) -> bool:
    dims_in_shapes = dims_in_dtypes = 0
    for row in rows[:2000]:
        dtypes, shapes = row[6], row[7]
        dims_in_shapes += _looks_like_dims(strings.get(shapes)) if shapes is not None else 0
        dims_in_dtypes += _looks_like_dims(strings.get(dtypes)) if dtypes is not None else 0
    return dims_in_dtypes > dims_in_shapes


def step_breakdown_db(folder: Path) -> list[dict]:
    """analysis.db's StepTraceTime, with step_trace_time.csv's column names."""
    db = folder / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    if not db.is_file():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name='StepTraceTime'").fetchone():
            return []
        cols = ["Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free",
                "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
        return [dict(zip(cols, (r[0],) + tuple(float(x or 0) for x in r[1:]), strict=False))
                for r in con.execute("SELECT step, computing, communication_not_overlapped, overlapped, communication, "
                                     "free, stage, bubble, communication_not_overlapped_and_exclude_receive, "
                                     "preparing FROM StepTraceTime")]
    finally:
        con.close()
