"""Fold individual operator calls into one ``Operator`` per distinct signature."""
from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median

from opscope.model import DEVICE, HOST_BATCH, IMPORT, OpCall, Operator
from opscope.overloads import overload_for

TRAINING_PHASES = ("forward", "backward", "optimizer")


def _phase(phases: Counter) -> str:
    """The most common phase; a signature that the training step runs too is training work, even when
    an evaluation ran it more often (nanoGPT's estimate_loss before its first step)."""
    phase = phases.most_common(1)[0][0]
    if phase == "eval":
        training = [(n, p) for p, n in phases.items() if p in TRAINING_PHASES]
        phase = max(training)[1] if training else phase
    return phase


def aggregate(calls: list[OpCall], steps_to_skip: int = 0, steady_steps: list | None = None,
              resolve_overloads: bool = True) -> list[Operator]:
    """Group calls by (name, overload, input shapes, dtypes); sum calls and times.

    ``phase``/``source``/``parent`` are the most common values; all seen values are kept
    in ``phases``/``sources``.  Sorted by total self time, biggest first.  With
    ``steady_steps``, ``steady_time_us`` is each signature's median self time per step
    over those steps (0 for a step without it): set-up and first-step work weigh nothing;
    ``steady_device_time_us`` the same of the device time of the kernels it launched.
    """
    groups: dict[tuple, dict] = {}
    frozen: dict = {}   # freeze_shared's: ``calls`` holds every list it names
    for call in calls:
        if call.overload is None and resolve_overloads:   # not when the capture resolved them (None: ambiguous)
            call.overload = overload_for(call.name, call.dtypes)
        key = call.signature(frozen)
        if call.device == HOST_BATCH:   # a host batch's torch.stack is not the device's torch.stack
            key = (*key, HOST_BATCH)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"first": call, "calls": 0, "self": 0.0, "total": 0.0, "device": 0.0,
                               "phases": Counter(), "sources": Counter(), "parents": Counter(), "libraries": Counter(),
                               "children": {}, "steps": set(), "on_device": False, "import": True,
                               "per_step": defaultdict(float), "per_step_device": defaultdict(float)}
        n = int(getattr(call, "count", 1) or 1)
        g["calls"] += n
        g["self"] += call.self_time_us
        g["total"] += call.total_time_us
        g["device"] += call.device_time_us
        g["phases"][call.phase] += n
        if call.source:
            g["sources"][call.source] += n
            g["libraries"][(call.source, getattr(call, "library", None))] += n
        g["parents"][call.parent] += n
        for child in call.children:
            g["children"].setdefault(child, None)
        g["steps"].add(call.step)
        g["on_device"] = g["on_device"] or call.device == DEVICE
        g["import"] = g["import"] and call.device == IMPORT
        g["per_step"][call.step] += call.self_time_us
        if call.device_time_us:
            g["per_step_device"][call.step] += call.device_time_us
    operators = []
    for g in groups.values():
        first: OpCall = g["first"]
        parent = g["parents"].most_common(1)[0][0]
        source = g["sources"].most_common(1)[0][0] if g["sources"] else None
        library = max(((n, lib) for (src, lib), n in g["libraries"].items() if src == source and lib),
                      default=(0, None))[1]
        operators.append(Operator(
            name=first.name, overload=first.overload, input_shapes=first.input_shapes, dtypes=first.dtypes,
            scalars=first.scalars, output_shapes=first.output_shapes, calls=g["calls"],
            self_time_us=round(g["self"], 3), total_time_us=round(g["total"], 3),
            device_time_us=round(g["device"], 3),
            phase=_phase(g["phases"]), phases=sorted(g["phases"]),
            source=source, sources=[s for s, _ in g["sources"].most_common()], library=library,
            parent=parent, top_level=parent is None, children=list(g["children"]),
            steps=sorted(g["steps"]), on_device=g["on_device"], import_time=g["import"],
            steady_time_us=round(median(g["per_step"].get(s, 0.0) for s in steady_steps), 3)
            if steady_steps else None,
            steady_device_time_us=round(median(g["per_step_device"].get(s, 0.0) for s in steady_steps), 3)
            if steady_steps else None,
        ))
    operators.sort(key=lambda o: (-o.self_time_us, o.name))
    return operators
