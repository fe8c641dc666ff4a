"""Turn a ScanResult into plain rows and figures every reporter shows the same way.

HTML, XLSX and Markdown must agree on what "time share" or "top fix" means, so the
arithmetic lives here once.  A scan.json written by an older or partial scan (no
verdicts yet, no summary) still renders, with "n/a"; the loader has checked its types.
The headline sentences live in ``headline``, the ``verify`` section in ``verification_view``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from opscope.model import VERDICTS, Operator, ScanResult, where_text

NA = "n/a"
BLOCKING = ("cpu-fallback", "unsupported", "unknown")

# One colour per verdict, shared by the HTML badges, the XLSX fills and the charts.
VERDICT_COLOURS = {
    "native": "#2e7d32",
    "composite": "#00838f",
    "adapter": "#1565c0",
    "cpu-fallback": "#ef6c00",
    "unsupported": "#c62828",
    "not-applicable": "#757575",
    "unknown": "#6a1b9a",
}
VERDICT_FILLS = {  # light backgrounds for spreadsheet cells
    "native": "C8E6C9",
    "composite": "B2EBF2",
    "adapter": "BBDEFB",
    "cpu-fallback": "FFE0B2",
    "unsupported": "FFCDD2",
    "not-applicable": "E0E0E0",
    "unknown": "E1BEE7",
}


def verdict_of(op: Operator) -> str:
    """An operator's verdict, 'unknown' when the verdict engine has not run."""
    return op.verdict if op.verdict in VERDICTS else "unknown"


def op_time_us(op: Operator) -> float:
    """Time an operator costs: device time where measured, else host self time.

    Self time (not total) so nested operators are never counted twice.
    """
    return float(op.device_time_us or 0.0) or float(op.self_time_us or 0.0)


def has_device_time(result: ScanResult) -> bool:
    """True when the scan measured the kernels its operators launched on a device (a GPU run): the costliest
    operators are then those whose kernels took the longest, with their host time beside it."""
    return any((op.device_time_us or 0.0) > 0 for op in result.operators)


def steady_host_us(op: Operator) -> float:
    """An operator signature's steady-state host time: the median per step after the first (its total time
    when no such step was captured)."""
    return float(op.steady_time_us) if op.steady_time_us is not None else op_time_us(op)


def steady_device_us(op: Operator) -> float:
    """The same of the device time of the kernels it launched (its total device time when no such step)."""
    steady = op.steady_device_time_us
    return float(steady) if steady is not None else float(op.device_time_us or 0.0)


def costliest_operators(result: ScanResult) -> list[tuple[Operator, float, float]]:
    """``(operator, device µs per step, host µs per step)``, costliest first, not-applicable set-up work left out.

    A scan that measured device time ranks by it (host time breaks ties); any other by the host time."""
    device = has_device_time(result)
    ops = [(op, steady_device_us(op) if device else 0.0, steady_host_us(op)) for op in result.operators
           if op.verdict != "not-applicable"]
    ops = [row for row in ops if row[1] > 0 or row[2] > 0] if device else [row for row in ops if row[2] > 0]
    ops.sort(key=lambda row: (-row[1], -row[2], row[0].qualified_name))
    return ops


def verdicts_computed(result: ScanResult) -> bool:
    """False when no operator carries a verdict (scan made before/without the verdict engine)."""
    return any(op.verdict for op in result.operators)


def total_time_us(result: ScanResult) -> float:
    return sum(op_time_us(op) for op in result.operators)


def share_time_us(op: Operator) -> float:
    """What an operator weighs in every share ("time affected", the verdicts' shares): its estimated NPU time
    per step when the scan has the estimate (from shapes: the same in identical scans), else time measured here."""
    return float(op.npu_time_us) if op.npu_time_us is not None else op_time_us(op)


def share_total_us(result: ScanResult) -> float:
    return sum(share_time_us(op) for op in result.operators)


def fmt_shapes(shapes) -> str:
    if not shapes:
        return ""
    if not isinstance(shapes, (list, tuple)):
        return str(shapes)
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" if isinstance(s, (list, tuple)) else str(s)
                     for s in shapes)


def fmt_dtypes(dtypes) -> str:
    if not isinstance(dtypes, (list, tuple)):
        return str(dtypes) if dtypes else ""
    return ", ".join(str(d) if d not in (None, "") else "None" for d in dtypes)


def _plain(value) -> str:
    """A nested evidence value as readable text: no Python dict or list reprs."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, (list, tuple)):
        return "; ".join(_plain(v) for v in value)
    return str(value)


def fmt_evidence(evidence) -> str:
    """Every detail of why a verdict was given (list, version, rule, path, ...), as readable text."""
    if not evidence:
        return ""
    if not isinstance(evidence, dict):
        return str(evidence)
    parts = []
    if evidence.get("list"):
        version = evidence.get("version")
        parts.append(f"{evidence['list']}" + (f" {version}" if version else ""))
    if evidence.get("rule"):
        parts.append(str(evidence["rule"]))
    path = evidence.get("path")
    if path:
        parts.append(" -> ".join(str(p) for p in path) if isinstance(path, (list, tuple)) else str(path))
    extra = [f"{k.replace('_', ' ')}: {_plain(v)}" for k, v in evidence.items()
             if k not in ("list", "version", "rule", "path") and v]
    return "; ".join(parts + extra)


def dtype_warning_texts(evidence) -> list[str]:
    """The dtype warnings (upstream numeric mismatches) of an operator's evidence."""
    warnings = (evidence or {}).get("dtype_warnings") if isinstance(evidence, dict) else None
    return [str(w) for w in warnings or []]


def _short_dtype_warning(text: str) -> str:
    """'float32: upstream test_compare_cpu fails for mm ... (numeric mismatch); ...' -> 'float32 numeric mismatch'."""
    dtype = text.split(":", 1)[0].strip()
    meaning = re.search(r"\(([^()]*\(([^()]+)\))", text)
    what = meaning.group(2) if meaning else "upstream test fails"
    return f"{dtype} {what}"


def fmt_evidence_short(evidence, verdict: str | None = None) -> str:
    """One short sentence saying why a verdict was given; ``fmt_evidence`` has the details."""
    if not evidence:
        return ""
    if not isinstance(evidence, dict):
        return str(evidence)
    rule = str(evidence.get("rule") or "")
    where = f"torch_npu {evidence['version']}" if evidence.get("version") else ""
    text = _rule_text(evidence, rule, where) or _decomposition_text(evidence, rule, where, verdict)
    if evidence.get("first_supported_in"):
        text += f"; supported from {evidence['first_supported_in']}"
    warnings = dtype_warning_texts(evidence)
    if warnings:
        text += "; warning: " + ", ".join(dict.fromkeys(_short_dtype_warning(w) for w in warnings)) + " upstream"
    return text


def _rule_text(evidence: dict, rule: str, where: str) -> str | None:
    """The sentence of a rule that names its reason itself (registered, host-only, a backend's kernel ...)."""
    if rule == "registered":
        return f"registered in {where}" if where else "registered for the NPU"
    if rule == "host-tensors":
        return "host-only set-up or data-loading work: stays on the CPU, needs no NPU kernel"
    if rule == "backend-private":
        return f"kernel private to the scanning machine's backend; {evidence.get('judged_through') or 'its parent'}" \
               " replaces it on the NPU"
    if rule == "backend-implements":
        public = str(evidence.get("implements") or "a public op")
        half = "the backward of " if evidence.get("part") == "backward" and not public.endswith("_backward") else ""
        kernel = f"{evidence['recorded_as']} ({evidence['backend']})" if evidence.get("recorded_as") and \
            evidence.get("backend") else "the scanning machine's own kernel"
        return (f"{kernel} for {half}{public}, which the NPU runs instead: judged as that op"
                + (f" (torch_npu {evidence['version']})" if evidence.get("version") else ""))
    if rule == "inside-parent-kernel":
        return f"runs inside {evidence.get('judged_through') or 'its parent'}'s kernel: needs no NPU support"
    if rule == "no-npu-kernel":
        return f"no NPU kernel in {where}: runs on the CPU" if where else "no NPU kernel: runs on the CPU"
    if rule.startswith("third-party"):
        return _third_party_text(evidence)
    return None


def _third_party_text(evidence: dict) -> str:
    """A library's op (third_party.yaml): the adapter release to install, or what happens without one."""
    if evidence.get("install"):
        runs = f" as {evidence['via']}" if evidence.get("via") else (
            f" (kernel {evidence['kernel']})" if evidence.get("kernel") else "")
        return f"runs on the NPU{runs} once {evidence['install']} is installed ({evidence.get('library')})"
    return str(evidence.get("detail") or "") or f"{evidence.get('library')}: see support_matrix/third_party.yaml"


def _decomposition_text(evidence: dict, rule: str, where: str, verdict: str | None) -> str:
    path = evidence.get("path")
    path_text = " -> ".join(str(p) for p in path) if isinstance(path, (list, tuple)) and len(path) > 1 else ""
    if verdict in ("cpu-fallback", "unsupported") and path_text:
        return f"decomposes ({path_text}) into a part with no NPU kernel: " + (
            "runs on the CPU" if verdict == "cpu-fallback" else "cannot run on the NPU")
    if path_text:
        return f"decomposes ({rule}): {path_text}" if rule else f"decomposes: {path_text}"
    if rule.startswith("Composite"):
        return f"implemented with other operators ({rule})"
    if rule:
        return f"{rule}" + (f" ({where})" if where else "")
    return fmt_evidence(evidence)


def fmt_substitute(substitute) -> str:
    if not substitute:
        return ""
    if not isinstance(substitute, dict):
        return str(substitute)
    text = str(substitute.get("replacement") or "")
    if substitute.get("rationale"):
        text = f"{text} ({substitute['rationale']})" if text else str(substitute["rationale"])
    return text


def fmt_dims(varying_dims) -> str:
    """`arg0.dim0: 32, 8` for each varying dimension."""
    parts = []
    for d in varying_dims or []:
        if isinstance(d, dict):
            values = ", ".join(str(v) for v in seq(d.get("values")))
            where = f"arg{d.get('arg', '?')}." + (f"dim{d['dim']}" if d.get("dim") is not None
                                                   else str(d.get("what") or "rank"))
            parts.append(f"{where}: {values}")
        else:
            parts.append(str(d))
    return "; ".join(parts)


def fmt_percent(share) -> str:
    if share is None:
        return NA
    if 0 < share < 0.0005:  # a real but tiny share must not read as nothing
        return "<0.1%"
    return f"{share * 100:.1f}%"


@dataclass
class OperatorRow:
    """One operator signature as every table shows it."""
    name: str
    verdict: str
    calls: int
    shapes: str
    dtypes: str
    time_us: float
    share: float
    phase: str
    source: str
    evidence: str
    substitute: str
    dynamic: bool
    evidence_detail: str = ""
    steady_time_us: float = 0.0
    host_time_us: float = 0.0       # host self time, over all captured steps
    device_time_us: float = 0.0     # device time of the kernels it launched, over all captured steps


def where_of(record, result: ScanResult) -> str:
    """An operator's / root cause's / finding's user line with the model/library line that made it
    (library first under a framework entry such as ``trainer.train()``)."""
    source = getattr(record, "source", None)
    if source is None and getattr(record, "file", None):
        source = f"{record.file}:{record.line}" if record.line else record.file
    return where_text(source, getattr(record, "library", None), getattr(result, "entry_lines", None) or ())


def root_cause_what(rc) -> str:
    """``partial-batch (batch size (dim 0)) set by ...``: a root cause's kind, the dimension that
    varied and the call that sets it."""
    what = rc.kind or rc.cause
    if getattr(rc, "varied", ""):
        what += f": {rc.varied} varies"
    if getattr(rc, "set_by", None):
        what += f", set by {rc.set_by}"
    return what


def operator_rows(result: ScanResult) -> list[OperatorRow]:
    """Operator rows, most expensive first; not-applicable (set-up, host-only) ones after all the others.

    A scan that measured device time (a GPU run) weighs each row by the device time of the kernels it
    launched (its share: of the step's kernel time; host time beside it); any other by ``op_time_us``."""
    device = has_device_time(result)
    if device:
        total = sum(float(op.device_time_us or 0.0) for op in result.operators)
    else:
        total = total_time_us(result) or 0.0
    rows = []
    for op in result.operators:
        t = float(op.device_time_us or 0.0) if device else op_time_us(op)
        rows.append(OperatorRow(
            name=op.qualified_name, verdict=verdict_of(op), calls=int(op.calls or 0),
            shapes=fmt_shapes(op.input_shapes), dtypes=fmt_dtypes(op.dtypes), time_us=t,
            share=(t / total) if total else 0.0, phase=op.phase or "",
            source=where_of(op, result), evidence=fmt_evidence_short(op.evidence, op.verdict),
            substitute=fmt_substitute(op.substitute), dynamic=bool(op.dynamic),
            evidence_detail=fmt_evidence(op.evidence), steady_time_us=float(op.steady_time_us or 0.0),
            host_time_us=float(op.self_time_us or 0.0), device_time_us=float(op.device_time_us or 0.0)))
    if device:
        rows.sort(key=lambda r: (r.verdict == "not-applicable", -r.time_us, -r.host_time_us, r.name))
    else:
        rows.sort(key=lambda r: (r.verdict == "not-applicable", -r.time_us, r.name))
    return rows


def verdict_counts(result: ScanResult) -> dict[str, int]:
    """Operator signatures per verdict: from the summary when present, else counted."""
    given = result.summary.verdict_counts
    if given:
        return {v: given.get(v) or 0 for v in VERDICTS}
    counts = {v: 0 for v in VERDICTS}
    for op in result.operators:
        counts[verdict_of(op)] += 1
    return counts


def verdict_time_share(result: ScanResult) -> dict[str, float]:
    """Share (0..1) of measured operator time per verdict."""
    given = result.summary.time_share
    if given:
        return {v: float(given.get(v) or 0.0) for v in VERDICTS}
    total = share_total_us(result)
    shares = {v: 0.0 for v in VERDICTS}
    if total:
        for op in result.operators:
            shares[verdict_of(op)] += share_time_us(op) / total
    return shares


def readiness_score(result: ScanResult):
    """The 0-100 score, None when nothing was measured (``summary.score_unavailable`` says why)."""
    return result.summary.readiness_score


@dataclass
class Fix:
    """One thing to fix before porting, with the share of time it affects."""
    kind: str           # "operator" | "dynamic shape" | "chip / dtype" | "CUDA API" | "install"
    what: str
    where: str
    share: float | None
    fix: str
    severity: str = "warning"
    ops: list = field(default_factory=list)
    link: str = ""      # anchor of the details in the HTML report ("#findings", "#operators", ...)
    detail: str = ""    # why the fix works (a substitute's rationale), shown on demand


# The order of the "what to change" list: what stops or slows the port outright first.
FIX_TIERS = {"operator": 0, "dynamic shape": 1, "chip / dtype": 2, "CUDA API": 2, "install": 3}


def is_chip_finding(finding) -> bool:
    """A dtype the chosen chip cannot run, or runs differently (analysis/verdicts/chip_dtypes.py), not a CUDA API."""
    from opscope.analysis.verdicts.chip_dtypes import is_chip_dtype_finding
    return is_chip_dtype_finding(finding)
_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def _fix_tier(fix: Fix) -> int:
    tier = FIX_TIERS.get(fix.kind, 4)
    if fix.kind in ("CUDA API", "chip / dtype") and fix.severity != "error":
        tier = 4  # warning/info findings after the error-level ones (and after what to install)
    return tier


def top_fixes(result: ScanResult, limit: int | None = 10) -> list[Fix]:
    """The ranked "what to change" list: blocking operators (with substitute and line), dynamic-shape
    root causes (with the fix), error-level CUDA findings, then the remaining findings.  Upstream
    numeric-mismatch notes are evidence to check, not a change: ``numeric_checks`` lists them.  Within a kind the biggest share of estimated NPU time (measured time without the
    estimate) comes first, then severity.
    """
    total = share_total_us(result)
    fixes: list[Fix] = []

    by_name: dict[str, dict] = {}
    for op in result.operators:
        verdict = verdict_of(op)
        if verdict not in BLOCKING or not op.verdict:  # no verdict computed is not a finding
            continue
        entry = by_name.setdefault(op.name, {"time": 0.0, "verdicts": set(), "sources": [], "sub": "", "why": ""})
        entry["time"] += share_time_us(op)
        entry["verdicts"].add(verdict)
        if op.source and where_of(op, result) not in entry["sources"]:
            entry["sources"].append(where_of(op, result))
        if not entry["sub"] and op.substitute:
            sub = op.substitute if isinstance(op.substitute, dict) else {"replacement": str(op.substitute)}
            entry["sub"] = str(sub.get("replacement") or sub.get("rationale") or "")
            entry["why"] = str(sub.get("rationale") or "") if sub.get("replacement") else ""
        evidence = op.evidence if isinstance(op.evidence, dict) else {}
        if not entry["sub"] and str(evidence.get("rule", "")).startswith("third-party"):
            entry["sub"] = str(evidence.get("detail") or "")   # Ascend's answer for a library's op
            entry["why"] = str(evidence.get("source") or "")
    for name, entry in by_name.items():
        worst = next(v for v in ("unsupported", "cpu-fallback", "unknown") if v in entry["verdicts"])
        fixes.append(Fix(
            kind="operator", what=f"{name} ({worst})", where=", ".join(entry["sources"][:3]),
            share=entry["time"] / total if total else None,
            fix=entry["sub"] or ("check support or replace the call" if worst != "cpu-fallback"
                                 else "runs on the host CPU: replace or move off the hot path"),
            severity="error" if worst == "unsupported" else "warning", ops=[name], link="#operators",
            detail=entry["why"]))

    fixes += _install_fixes(result, total)
    op_time_by_name: dict[str, float] = {}
    for op in result.operators:
        op_time_by_name[op.name] = op_time_by_name.get(op.name, 0.0) + share_time_us(op)
    for rc in result.root_causes:
        affected = sum(op_time_by_name.get(name, 0.0) for name in rc.ops or [])
        fixes.append(Fix(
            kind="dynamic shape", what=f"{root_cause_what(rc)}: {len(rc.ops or [])} ops get changing shapes",
            where=where_of(rc, result), share=affected / total if total else None,
            fix=rc.suggestion or "make the shape fixed (pad, drop_last=True)", ops=list(rc.ops or []),
            link="#dynamic"))

    for i, finding in enumerate(result.findings):
        if finding.rule == "framework-cuda":
            continue   # a library's own CUDA calls: listed under Remapped, nothing to change in the script
        where = where_of(finding, result) if finding.file else ""
        fixes.append(Fix(
            kind="chip / dtype" if is_chip_finding(finding) else "CUDA API", what=finding.api, where=where, share=None,
            fix=finding.replacement or finding.message, severity=finding.severity or "warning",
            link=f"#finding-{i + 1}"))

    fixes.sort(key=lambda f: (_fix_tier(f), -(f.share or 0.0), _SEVERITY_RANK.get(f.severity, 1), f.where, f.what))
    return fixes if limit is None else fixes[:limit]


def _install_fixes(result: ScanResult, total: float) -> list[Fix]:
    """One "install" row per adapter package that ``adapter`` operators need (torchvision_npu TAG)."""
    by_install: dict[str, dict] = {}
    for op in result.operators:
        evidence = op.evidence if isinstance(op.evidence, dict) else {}
        if verdict_of(op) != "adapter" or not evidence.get("install"):
            continue
        entry = by_install.setdefault(evidence["install"], {"ops": [], "time": 0.0, "sources": [], "ev": evidence})
        entry["time"] += share_time_us(op)
        if op.name not in entry["ops"]:
            entry["ops"].append(op.name)
        if op.source and where_of(op, result) not in entry["sources"]:
            entry["sources"].append(where_of(op, result))
    fixes = []
    for install, entry in by_install.items():
        ev = entry["ev"]
        without = f"; without it: {ev['without']}" if ev.get("without") else ""
        fixes.append(Fix(kind="install", what=f"install {install} for {', '.join(entry['ops'])}",
                         where=", ".join(entry["sources"][:3]), share=entry["time"] / total if total else None,
                         fix=f"{install} ({ev.get('paired', '')}); then {ev.get('activate') or 'import it'}",
                         severity="info", ops=entry["ops"], link="#operators",
                         detail=f"source: {ev.get('adapter_source', '')}{without}"))
    return fixes


THIRD_PARTY_HEADERS = ["library", "version here", "on the Ascend machine", "operators (verdict, time share)",
                       "time share"]


def third_party_rows(result: ScanResult) -> list[list]:
    """The "Third-party libraries" section, one row per library (scan.json ``third_party``)."""
    rows = []
    for lib in result.third_party or []:
        ascend = f"install {lib.install} ({lib.paired})" if lib.install else "no adapter: see the operators' verdicts"
        ops = "; ".join(f"{e.name} ({e.verdict}, {fmt_percent(e.time_share)})" for e in lib.ops)
        rows.append([lib.library, lib.version_here, ascend, ops, lib.time_share])
    return rows


@dataclass
class NumericCheck:
    """One operator family whose upstream torch_npu tests report results differing from the CPU in a
    dtype the scan used: evidence to check with ``opscope verify``, not a change to make."""
    family: str         # the OpInfo name the upstream test lists (addmm, nn.functional.linear, ...)
    dtypes: list
    meaning: str        # what the failing test means ("results differ from the CPU beyond ...")
    test: str           # the failing upstream test (test_compare_cpu)
    ops: list
    sources: list
    share: float | None

    @property
    def what(self) -> str:
        return f"{'/'.join(self.dtypes)} {self.family}"

    def line(self) -> str:
        """The one evidence line a report prints for it (the verify command is said once, above)."""
        where = f" ({', '.join(self.sources[:2])})" if self.sources else ""
        short = re.search(r"\(([^()]+)\)$", self.meaning)
        return f"{self.what}{where}: upstream {self.test} fails on the NPU ({short.group(1) if short else self.meaning})"


VERIFY_HINT = ("evidence, not a change: upstream torch_npu tests report results that differ from the CPU for "
               "these operators in the dtypes this scan used; `opscope verify {run_dir} --device npu` "
               "measures them on your shapes")


_WARNING = re.compile(r"^(?P<dtype>[\w.]+): upstream (?P<test>\S+) fails for (?P<family>\S+) on the NPU "
                      r"\((?P<meaning>.*?)(?:; unsupported_ops_info.*)?\)$")


def numeric_checks(result: ScanResult) -> list[NumericCheck]:
    """One evidence line per operator family with an upstream numeric mismatch, most time first."""
    total = share_total_us(result)
    families: dict[str, dict] = {}
    for op in result.operators:
        if verdict_of(op) not in ("native", "composite"):
            continue
        for text in dtype_warning_texts(op.evidence):
            m = _WARNING.match(text)
            if not m:
                continue
            entry = families.setdefault(m["family"], {"dtypes": [], "meaning": m["meaning"], "test": m["test"], "ops": [],
                                                      "sources": [], "time": 0.0})
            for key, value in (("dtypes", m["dtype"]), ("ops", op.name), ("sources", op.source)):
                if value and value not in entry[key]:
                    entry[key].append(value)
            entry["time"] += share_time_us(op)
    checks = [NumericCheck(family, e["dtypes"], e["meaning"], e["test"], e["ops"], e["sources"],
                           e["time"] / total if total else None) for family, e in families.items()]
    checks.sort(key=lambda c: (-(c.share or 0.0), c.family))
    return checks


def not_supported_rows(rows: list[OperatorRow]) -> list[OperatorRow]:
    return [r for r in rows if r.verdict in BLOCKING]


def obj(value) -> dict:
    """``value`` if it is a JSON object, else {}: free-form blocks (evidence, e2e) may hold anything."""
    return value if isinstance(value, dict) else {}


def seq(value) -> list:
    """``value`` if it is a JSON list, else []."""
    return value if isinstance(value, list) else []
