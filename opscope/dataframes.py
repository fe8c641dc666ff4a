"""Analyse runs in a notebook: ``opscope.load(run_dir)`` and ``opscope.load_diff(a, b)``.

Like HolisticTraceAnalysis or TraceLens, the result is tables you can group, filter and
plot; here they are pandas DataFrames built from scan.json (the same rows every report
shows).  pandas is imported only when a table is first asked for, so ``import opscope``
stays light::

    run = opscope.load("runs/cnn")
    run.operators.groupby("verdict")["steady_time_us"].sum()
    run.fixes.head()
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path


def _frame(rows: list[dict], columns: list[str]):
    import pandas as pd  # lazily: 0.5-1 s of import only for those who use the tables
    return pd.DataFrame(rows, columns=columns)


OPERATOR_COLUMNS = ["name", "overload", "qualified_name", "verdict", "phase", "calls", "input_shapes", "dtypes",
                    "self_time_us", "total_time_us", "device_time_us", "steady_time_us", "time_us", "time_share",
                    "source", "library", "parent", "top_level", "on_device", "dynamic", "evidence", "evidence_detail",
                    "substitute"]


class Run:
    """One `opscope scan` run folder (or scan.json) as DataFrames.

    ``operators`` (one row per operator signature), ``findings`` (CUDA-only APIs),
    ``dynamic_shapes`` (operators whose shapes changed), ``root_causes`` (the lines that
    make them change), ``steps`` (one row per captured step), ``fixes`` (the ranked
    "what to change" list of the reports), ``npu_estimate`` (operators by estimated NPU time on the
    scan's chip) and ``verification`` (after `opscope verify`).
    ``result`` is the underlying ``ScanResult``; ``summary`` and ``score`` its summary.
    """

    def __init__(self, result, path: Path | None = None):
        self.result = result
        self.path = path

    def __repr__(self) -> str:
        where = f" {self.path}" if self.path else ""
        return (f"<opscope.Run{where}: {len(self.result.operators)} operator signatures, "
                f"{len(self.result.steps)} steps, score {self.score}>")

    @property
    def summary(self) -> dict:
        """The scan's summary: readiness score, signatures and time share per verdict, counts of findings."""
        return self.result.summary.to_dict()

    @property
    def score(self):
        """The readiness score (0-100), or None when the scan measured no training iteration."""
        return self.result.summary.readiness_score

    @cached_property
    def operators(self):
        """One row per operator signature: verdict, shapes, dtypes, phase, source line, times, evidence."""
        from opscope.report import view
        total = view.total_time_us(self.result) or 0.0
        rows = []
        for op in self.result.operators:
            t = view.op_time_us(op)
            rows.append({
                "name": op.name, "overload": op.overload, "qualified_name": op.qualified_name,
                "verdict": view.verdict_of(op), "phase": op.phase, "calls": int(op.calls or 0),
                "input_shapes": view.fmt_shapes(op.input_shapes), "dtypes": view.fmt_dtypes(op.dtypes),
                "self_time_us": float(op.self_time_us or 0.0), "total_time_us": float(op.total_time_us or 0.0),
                "device_time_us": float(op.device_time_us or 0.0),
                "steady_time_us": float(op.steady_time_us) if op.steady_time_us is not None else float("nan"),
                "time_us": t, "time_share": t / total if total else 0.0, "source": op.source,
                "library": op.library, "parent": op.parent, "top_level": op.top_level, "on_device": op.on_device,
                "dynamic": bool(op.dynamic), "evidence": view.fmt_evidence_short(op.evidence, op.verdict),
                "evidence_detail": view.fmt_evidence(op.evidence), "substitute": view.fmt_substitute(op.substitute)})
        return _frame(rows, OPERATOR_COLUMNS)

    @cached_property
    def findings(self):
        """One row per CUDA-only API finding (static, run-time or both) with its NPU replacement."""
        columns = ["severity", "file", "line", "column", "rule", "api", "replacement", "origin", "count",
                   "remapped_to", "message", "snippet", "library"]
        return _frame([{k: f.to_dict().get(k) for k in columns} for f in self.result.findings], columns)

    @cached_property
    def dynamic_shapes(self):
        """One row per operator whose input shapes changed between steps, with its root cause."""
        from opscope.report import view
        columns = ["op", "source", "cause", "varying_dims", "root_cause", "suggestion", "steps"]
        rows = [{"op": d.op, "source": d.source, "cause": d.cause, "varying_dims": view.fmt_dims(d.varying_dims),
                 "root_cause": d.root_cause, "suggestion": d.suggestion,
                 "steps": len(d.shapes_per_step or {})} for d in self.result.dynamic_shapes]
        return _frame(rows, columns)

    @cached_property
    def root_causes(self):
        """One row per line that makes shapes change (the line to fix), with the fix suggested."""
        from opscope.report import view
        columns = ["source", "library", "kind", "cause", "varying_dims", "varied", "set_by", "ops", "suggestion"]
        rows = [{"source": rc.source, "library": rc.library, "kind": rc.kind, "cause": rc.cause,
                 "varying_dims": view.fmt_dims(rc.varying_dims), "varied": rc.varied, "set_by": rc.set_by,
                 "ops": len(rc.ops or []), "suggestion": rc.suggestion} for rc in self.result.root_causes]
        return _frame(rows, columns)

    @cached_property
    def steps(self):
        """One row per captured step: duration, operator calls, whether it was complete, time per phase."""
        rows = []
        for s in self.result.steps:
            row = s.to_dict() if hasattr(s, "to_dict") else dict(vars(s))
            for phase, us in (row.pop("phase_time_us", None) or {}).items():  # one column per phase
                row[f"{phase}_us"] = us
            rows.append(row)
        columns = list(dict.fromkeys(k for row in rows for k in row)) or ["index", "duration_us"]
        return _frame(rows, columns)

    @property
    def plan(self) -> dict | None:
        """The port plan (``opscope matrix plan``): releases, the planned one with torch / Python / CANN, the
        changes to this environment, the install block, as scan.json stores it (``run.result.plan`` is the typed
        ``PortPlan``); None for a scan that measured nothing."""
        return self.result.plan.to_dict() if self.result.plan is not None else None

    @cached_property
    def plan_changes(self):
        """One row per change the plan asks of the environment or the project's requirement files."""
        from opscope.report import plan_view
        rows = plan_view.change_rows(self.result.plan) if self.result.plan is not None else []
        columns = ["where", "package", "now", "planned", "why"]
        return _frame([dict(zip(columns, row, strict=True)) for row in rows], columns)

    @cached_property
    def memory_fit(self):
        """One row per layout (single card, ZeRO-1/2/3, tensor parallel): cards needed and GiB per card."""
        from opscope.analysis.npu.memory_fit import rows
        fit = self.result.memory_fit
        return _frame(rows(fit) if fit else [], ["layout", "cards", "per_card_gib"])

    @cached_property
    def fixes(self):
        """The ranked "what to change" list of the reports, one row per change."""
        from opscope.report import view
        columns = ["kind", "severity", "what", "where", "time_share", "change", "why", "operators"]
        rows = [{"kind": f.kind, "severity": f.severity, "what": f.what, "where": f.where, "time_share": f.share,
                 "change": f.fix, "why": f.detail, "operators": ", ".join(f.ops)}
                for f in view.top_fixes(self.result, limit=None)]
        return _frame(rows, columns)

    @cached_property
    def npu_estimate(self):
        """Operators ranked by *estimated* NPU time on the scan's chip (``attrs``: chip, step figures)."""
        columns = ["kind", "operator", "input_shapes", "dtypes", "phase", "source", "calls_per_step", "kernels",
                   "npu_time_us", "cube_us", "vector_us", "aicpu_us", "transdata_us", "host_us", "reason", "fix"]
        est = self.result.npu_estimate
        frame = _frame([{k: getattr(r, k) for k in columns} for r in est.rows] if est else [], columns)
        frame.attrs.update({"chip": est.chip if est else None, "step": est.step.to_dict() if est else None,
                            "estimate": True})
        return frame

    @cached_property
    def verification(self):
        """After `opscope verify`: one row per replayed signature with its outcome and error measures."""
        from opscope.report import verification_view
        columns = ["op", "overload", "shapes", "dtypes", "outcome", "cosine", "max_abs_err", "max_rel_err",
                   "standard", "message", "predicted_verdict", "disagreement"]
        rows = [dict(vars(r)) for r in verification_view.verification_rows(self.result.verification)]
        return _frame(rows, columns)


class Diff:
    """``opscope diff A B`` as DataFrames: ``operators`` (one row per paired signature, biggest
    regression first), ``only_a`` / ``only_b``, ``inserted``, ``fallbacks``; ``result`` is the DiffResult."""

    def __init__(self, result):
        self.result = result

    def __repr__(self) -> str:
        return (f"<opscope.Diff {self.result.a.get('label')} vs {self.result.b.get('label')}: "
                f"{len(self.result.operators)} signatures>")

    @cached_property
    def operators(self):
        """One row per signature paired between A and B, biggest regression first."""
        rows = [dict(vars(r)) for r in self.result.operators]
        columns = list(dict.fromkeys(k for row in rows for k in row)) or ["name", "phase", "status", "delta_us"]
        for row in rows:
            for key, value in row.items():
                if isinstance(value, (list, tuple, dict)):
                    row[key] = str(value) if not isinstance(value, list) else "; ".join(map(str, value))
        return _frame(rows, columns)

    def _items(self, items):
        rows = [dict(i) for i in items]
        return _frame(rows, list(dict.fromkeys(k for row in rows for k in row)))

    @property
    def only_a(self):
        """Signatures recorded only in A."""
        return self._items(self.result.only_a)

    @property
    def only_b(self):
        """Signatures recorded only in B."""
        return self._items(self.result.only_b)

    @property
    def inserted(self):
        """Kernels the NPU side inserted that no operator of A asked for (TransData, Cast, ...)."""
        return self._items(self.result.inserted)

    @property
    def fallbacks(self):
        """CPU fallbacks found in either profile (host-side child events, or a torch_npu log), with the side."""
        return self._items(self.result.fallbacks)


def load(run_dir) -> Run:
    """A run folder written by `opscope scan` (or its scan.json) as a ``Run`` of DataFrames."""
    from opscope.report.json_out import read_scan_json
    path = Path(run_dir)
    return Run(read_scan_json(path), path)


def load_diff(a, b, **options) -> Diff:
    """Compare two profiles as `opscope diff A B` does (opscope run folders, Chrome traces, profiler
    text tables, Ascend folders); ``options`` are diff_profiles' (label_a, label_b, warmup, batch_size, ...)."""
    from opscope.analysis.diff.profiles import diff_profiles
    from opscope.parsers import load_profiles
    return Diff(diff_profiles(load_profiles(a), load_profiles(b), **options))
