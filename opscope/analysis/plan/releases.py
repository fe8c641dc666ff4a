"""The release plan: which torch_npu releases run a scan's operators, and what each installs with.

Every exact torch_npu release of the support matrix judges the scan's operators with the scan's own judge
(``verdicts.assign_verdicts`` plus the host-only marking of ``scan_result``), so a release's count here is the
``blocking_signatures`` a scan with ``--target`` that release would report.  From the counts:

* the oldest and the newest release on which none of them falls back (or, when every release has some, the
  fewest do), and the runs of consecutive releases that share that best count;
* for each operator that blocks some release, the first release that runs it (the same answer as
  ``opscope matrix show OP``), and the release from which every later one does (support is not monotonic:
  a line's newest post-release can register an op that the next line's first release lacks);
* the planned release: ``target`` when given, else the newest best release whose CANN pairing Ascend's own
  table states (then one whose pairing is inferred, then any);
* for each planned release: torch (the wheel's METADATA, from the matrix), Python (its wheels on PyPI) and
  CANN from ``support_matrix/release_pairs.yaml``, and the Ascend adapter release (torchvision_npu, apex) of
  each third-party library whose operators the scan recorded (``third_party.adapter_release``).

Pure: no printing, no files written.  The plan is built as JSON (the keys and order scan.json has always had)
and returned as the typed ``model.PortPlan`` read from it, so what is stored and what reports read agree.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from opscope.analysis.plan.pairs import PAIRS_FILE, pairs
from opscope.knowledge import load_optional
from opscope.model import PortPlan, ScanResult

BAD = ("cpu-fallback", "unsupported", "unknown")


def _version_key(version: str) -> tuple:
    from opscope.matrix.versions import version_key
    return version_key(version)


def _source_text(key: str | None) -> str:
    """``Ascend/pytorch@9e73e708 COMPATIBILITY.en.md ...`` for a source key of release_pairs.yaml."""
    if not key:
        return ""
    source = (pairs().get("sources") or {}).get(key) or {}
    where = source.get("repo") or source.get("package") or source.get("url") or key
    pin = str(source.get("commit") or "")[:8] or str(source.get("version") or source.get("retrieved") or "")
    return f"{where}{'@' + pin if pin else ''} {source.get('at', '')}".strip()


def release_facts(version: str) -> dict:
    """torch / Python / CANN of one exact torch_npu release, each with where it comes from."""
    from opscope.matrix.build import release_line
    from opscope.matrix.store import load_matrix
    matrix = load_matrix()
    release = matrix.exact.get(version)
    try:
        line = release.line if release is not None else release_line(version)
    except Exception:   # an op-plugin-only line such as "2.15"
        line = version
    facts_file = pairs()
    line_data = (facts_file.get("lines") or {}).get(line) or {}
    data = (facts_file.get("releases") or {}).get(version) or {}
    torch = release.torch if release is not None and release.torch else line_data.get("torch")
    facts: dict[str, Any] = {
        "torch_npu": version, "line": line,
        "torch": torch,
        "torch_source": ("the torch_npu wheel's METADATA (support_matrix/versions/)"
                         if release is not None and release.torch else _source_text(line_data.get("source"))),
        "python": list(data.get("python") or line_data.get("python") or []),
        "python_source": _source_text("PP") if data.get("python") else _source_text(line_data.get("source")),
        "cann": data.get("cann"),
        "cann_source": _source_text(data.get("source")),
        "cann_inferred": bool(data.get("inferred")),
        "branch": data.get("branch"),
        "line_status": line_data.get("status"),
        "line_eol": line_data.get("eol"),
        "from_wheel": release is not None,
    }
    if data.get("why"):
        facts["cann_why"] = data["why"]
    if not data:
        facts["cann_why"] = f"torch_npu {version} is not in support_matrix/{PAIRS_FILE}"
    return facts


# ---- judging every release -----------------------------------------------------------------------

def _uses_device(operators) -> bool:
    return not any((op.evidence or {}).get("rule") == "setup-without-device" for op in operators)


def judge_releases(operators, versions: list[str] | None = None, uses_device: bool | None = None) -> list[dict]:
    """For each release (default: every exact release of the matrix, oldest first): the signatures that fall
    back or are not covered there, as the scan's judge finds them (``assign_verdicts`` + host-only marking)."""
    from opscope.analysis.verdicts.support import assign_verdicts, mark_host_only
    from opscope.matrix.judge import RANK
    from opscope.matrix.store import load_matrix
    operators = list(operators)
    uses_device = _uses_device(operators) if uses_device is None else uses_device
    versions = list(versions) if versions is not None else load_matrix().versions
    rows = []
    for version in versions:
        ops = [copy.copy(op) for op in operators]
        info = assign_verdicts(ops, version)
        mark_host_only(ops, uses_device)
        blocking: dict[str, str] = {}
        for op in ops:
            if op.verdict in BAD:
                name = op.qualified_name
                if name not in blocking or RANK[op.verdict] > RANK[blocking[name]]:
                    blocking[name] = op.verdict
        rows.append({"version": info["version"], "line": info["line"], "torch": info.get("torch"),
                     "blocking_signatures": sum(1 for op in ops if op.verdict in BAD),
                     "blocking_ops": dict(sorted(blocking.items()))})
    return rows


def _runs(versions: list[str], chosen: set) -> list[list[str]]:
    """Consecutive runs (in release order) of the chosen releases: [[first, last], ...]."""
    runs: list[list[str]] = []
    previous_in = False
    for version in versions:
        if version in chosen:
            if previous_in:
                runs[-1][1] = version
            else:
                runs.append([version, version])
        previous_in = version in chosen
    return runs


def blockers(rows: list[dict]) -> list[dict]:
    """Each operator that falls back on some release: where it does, the first release that runs it, and the
    release from which every later one does."""
    versions = [r["version"] for r in rows]
    names = sorted({name for r in rows for name in r["blocking_ops"]})
    out = []
    for name in names:
        bad = [r["version"] for r in rows if name in r["blocking_ops"]]
        good = [v for v in versions if v not in bad]
        stable = None
        for version in reversed(versions):
            if version in bad:
                break
            stable = version
        verdicts = sorted({r["blocking_ops"][name] for r in rows if name in r["blocking_ops"]})
        out.append({"op": name, "verdicts": verdicts, "blocks": len(bad), "first_supported_in": good[0] if good else None,
                    "supported_from": stable, "blocked_in": _runs(versions, set(bad)),
                    "supported_in": _runs(versions, set(good))})
    return sorted(out, key=lambda b: (b["first_supported_in"] is None, _version_key(b["first_supported_in"] or "0"),
                                      b["op"]))


def _third_party_libraries(operators) -> list[tuple[str, dict]]:
    """(name, library) of third_party.yaml for the namespaces of the scan's operators that have an adapter."""
    libraries = load_optional("third_party.yaml").get("libraries") or {}
    namespaces = {op.name.rpartition("::")[0] for op in operators if "::" in op.name}
    found = []
    for name, library in libraries.items():
        names = library.get("namespace")
        names = names if isinstance(names, list) else [names]
        if library.get("adapter") and namespaces & set(names):
            found.append((name, library))
    return found


def adapters_for(operators, version: str) -> list[dict]:
    """The Ascend adapter release of each third-party library whose ops the scan recorded, for ``version``."""
    from opscope.analysis.verdicts.third_party import adapter_release
    out = []
    for name, library in _third_party_libraries(operators):
        adapter = library["adapter"]
        release, how = adapter_release(adapter, version)
        row = {"library": name, "adapter": adapter.get("package"), "paired": how,
               "install": adapter.get("install"), "activate": adapter.get("activate")}
        if release is not None:
            row["tag"] = release.get("tag")
            row["cann"] = release.get("cann")
        out.append(row)
    return out


def _choose(best: list[str], target: str | None) -> tuple[str, str]:
    """(planned release, why) among the best releases (oldest first)."""
    if target:
        from opscope.matrix.store import load_matrix, resolve_release
        return resolve_release(load_matrix(), target).version, "asked for with --target"
    facts = {v: release_facts(v) for v in best}
    verified = [v for v in best if facts[v]["cann"] and not facts[v]["cann_inferred"]]
    if verified:
        return verified[-1], ("the newest release with the fewest operators not running natively whose CANN "
                              "pairing Ascend's compatibility table states")
    inferred = [v for v in best if facts[v]["cann"]]
    if inferred:
        return inferred[-1], ("the newest release with the fewest operators not running natively that has a CANN "
                              "pairing (inferred from its release branch)")
    return best[-1], "the newest release with the fewest operators not running natively (no CANN pairing known)"


def build_plan(operators, target: str | None = None, uses_device: bool | None = None,
               rows: list[dict] | None = None) -> PortPlan:
    """The release plan of a scan's operators (see the module docstring), without the environment check."""
    return PortPlan.from_dict(_plan_json(operators, target, uses_device, rows), "$.plan")


def _plan_json(operators, target: str | None = None, uses_device: bool | None = None,
               rows: list[dict] | None = None) -> dict:
    """``build_plan`` as the JSON object scan.json stores."""
    started = time.perf_counter()
    operators = list(operators)
    rows = rows if rows is not None else judge_releases(operators, uses_device=uses_device)
    judged_s = time.perf_counter() - started
    versions = [r["version"] for r in rows]
    fewest = min(r["blocking_signatures"] for r in rows)
    best = [r["version"] for r in rows if r["blocking_signatures"] == fewest]
    planned, why = _choose(best, target)
    planned_row = next((r for r in rows if r["version"] == planned), None)
    if planned_row is None:   # an op-plugin-only line: judged on its own
        planned_row = judge_releases(operators, [planned], uses_device)[0]
    plan = {
        "releases_judged": len(rows),
        "fewest_blocking": fewest,
        "all_native": fewest == 0,
        "oldest": release_facts(best[0]),
        "newest": release_facts(best[-1]),
        "best_ranges": _runs(versions, set(best)),
        "planned": {**release_facts(planned), "why": why,
                    "blocking_signatures": planned_row["blocking_signatures"],
                    "blocking_ops": planned_row["blocking_ops"]},
        "blockers": blockers(rows),
        "per_release": [{"version": r["version"], "torch": r["torch"], "blocking_signatures": r["blocking_signatures"]}
                        for r in rows],
        "adapters": adapters_for(operators, planned),
        "sources": {"pairs": f"support_matrix/{PAIRS_FILE}", "judge": "opscope.analysis.verdicts.support.assign_verdicts"},
    }
    plan["timing_s"] = {"judge_all_releases": round(judged_s, 3), "total": round(time.perf_counter() - started, 3)}
    return plan


def plan_for(result, target: str | None = None, environment: bool = True) -> PortPlan:
    """The release plan of a ``ScanResult`` (with the environment check and the install block when
    ``environment``): ``ScanResult.plan``, for reports and ``opscope.load``."""
    if not isinstance(result, ScanResult):
        raise TypeError("plan_for needs a ScanResult (opscope.schema.load_scan)")
    plan = _plan_json(result.operators, target=target)
    if environment:
        from opscope.analysis.plan.environment import environment_against
        plan["environment"] = environment_against(plan["planned"], script=result.script, cwd=result.cwd,
                                                  adapters=plan["adapters"])
        plan["install"] = plan["environment"]["install"]
    return PortPlan.from_dict(plan, "$.plan")
