"""Advice only where it is actionable: a fix that fits what the run actually showed.

A DataLoader whose smaller last batch reached evaluation forwards and never a backward pass
(a validation loader) must not be told ``drop_last=True``: dropping samples changes the metric, and the
training step's shapes never changed.  Its root cause keeps its evidence; the suggestion
becomes the evaluation one (``partial-batch-eval`` in ``support_matrix/dynamic_shapes.yaml``).
"""
from __future__ import annotations

TRAINING_PHASES = frozenset({"backward", "optimizer"})   # a batch that reaches these is trained on


def eval_only_partial_batches(roots, dynamic, calls) -> None:
    """Give partial-batch root causes seen only in evaluation the evaluation fix, in place."""
    from opscope.knowledge import load
    tip = (load("dynamic_shapes.yaml").get("suggestions") or {}).get("partial-batch-eval")
    if not tip:
        return
    for rc in roots:
        if rc.kind != "partial-batch":
            continue
        mine = [d for d in dynamic if d.root_cause == rc.source]
        keys = {(d.op, d.source) for d in mine}
        phases = {c.phase for c in calls if (c.name, c.source) in keys}
        if "eval" in phases and not phases & TRAINING_PHASES:
            rc.suggestion = tip
            rc.evidence += ("; its batches only reached evaluation forwards (phase eval), never a backward "
                            "pass: an evaluation loader")
            for d in mine:
                d.suggestion = tip
