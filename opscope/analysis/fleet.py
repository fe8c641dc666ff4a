"""Aggregate a fleet of scans: which operators block how many models, on which torch_npu version.

Pure functions of the jobs' records and their ``ScanResult``s (aggregation with pandas):

* each assessed model is judged again against every target release line (the same
  ``assign_verdicts`` / ``readiness_summary`` as ``opscope scan --target``), giving its
  readiness score and blocking operators per version;
* per operator and version: how many models it blocks (a verdict of cpu-fallback,
  unsupported or unknown, as in a scan's ``blocking_ops``), its share of all the models'
  steady-state operator time, and the substitute;
* dynamic-shape root causes by kind across models;
* versions side by side: upgrading from each older line to the newest unblocks which models
  and which operators stop blocking every model.

A model is *ready* on a version when none of its operators blocks there.
"""
from __future__ import annotations

import copy
import dataclasses

from opscope.version import __version__

FLEET_SCHEMA = "opscope.fleet/1"


def default_lines() -> list[str]:
    """Every release line built from a real torch_npu wheel, oldest first."""
    from opscope.matrix.store import load_matrix

    matrix = load_matrix()
    return [line for line, rel in matrix.releases.items() if rel.from_wheel]


def resolve_lines(spec: str | None) -> list[str]:
    """'2.1,2.8,2.14' (lines: each line's newest release) or exact releases ('2.8.0.post2') -> the
    targets judged, oldest first; None -> every release line with a wheel.  Unknown ones raise UserError."""
    from opscope.matrix.store import load_matrix, resolve_release

    if not spec:
        return default_lines()
    matrix = load_matrix()
    chosen: dict = {}
    for part in (p.strip() for p in spec.split(",")):
        if part:
            release = resolve_release(matrix, part)
            key = part.partition("==")[2].strip() if "==" in part else part
            chosen.setdefault(release.version, key)
    return [chosen[v] for v in sorted(chosen, key=_version_key)]


def _version_key(version: str):
    from opscope.matrix.store import version_key

    return version_key(version)


def target_version(key: str) -> str:
    from opscope.matrix.store import load_matrix, resolve_release

    return resolve_release(load_matrix(), key).version


def judge_versions(result, lines: list[str]) -> dict:
    """{line: {"summary": readiness summary, "version": torch_npu version}} for one scan."""
    from opscope.analysis.verdicts.support import assign_verdicts, mark_host_only, readiness_summary

    uses_device = not any((op.evidence or {}).get("rule") == "setup-without-device" for op in result.operators)
    out = {}
    for line in lines:
        ops = copy.deepcopy(result.operators)
        target = assign_verdicts(ops, line)
        judged = dataclasses.replace(result, operators=ops)
        mark_host_only(judged.operators, uses_device)
        out[line] = {"summary": readiness_summary(judged), "version": target["version"]}
    return out


def _op_time(result) -> float:
    from opscope.analysis.verdicts.support import op_time_basis
    op_time = op_time_basis(result.operators)[1]
    return float(sum(op_time(op) for op in result.operators))


def aggregate_fleet(records: list[dict], results: dict, lines: list[str], settings: dict | None = None) -> dict:
    """The fleet.json document.  ``records``: every job's record; ``results``: name -> ScanResult
    of the jobs that finished (``status`` ok)."""
    import pandas as pd

    versions = {line: target_version(line) for line in lines}
    model_rows, op_rows, root_rows = [], [], []
    totals = {}
    for name, result in sorted(results.items()):
        totals[name] = _op_time(result)
        for line, judged in judge_versions(result, lines).items():
            s = judged["summary"]
            model_rows.append({"model": name, "line": line, "score": s["readiness_score"],
                               "blocking_ops": len(s["blocking_ops"]),
                               "blocking_time_share": s["blocking_time_share"],
                               "dynamic_root_causes": s["dynamic_root_causes"],
                               "ready": not s["blocking_ops"]})
            for b in s["blocking_ops"]:
                op_rows.append({"model": name, "line": line, "op": b["op"], "verdict": b["verdict"],
                                "time_us": float(b["self_time_us"]), "model_time_share": b["time_share"],
                                "substitute": b.get("substitute"), "first_supported_in": b.get("first_supported_in"),
                                "source": b.get("source")})
        for root in result.root_causes or []:
            root_rows.append({"model": name, "kind": getattr(root, "kind", None) or "untraced",
                              "source": getattr(root, "source", None), "cause": getattr(root, "cause", "")})
    models_df = pd.DataFrame(model_rows, columns=["model", "line", "score", "blocking_ops", "blocking_time_share",
                                                  "dynamic_root_causes", "ready"])
    ops_df = pd.DataFrame(op_rows, columns=["model", "line", "op", "verdict", "time_us", "model_time_share",
                                            "substitute", "first_supported_in", "source"])
    roots_df = pd.DataFrame(root_rows, columns=["model", "kind", "source", "cause"])
    fleet_time = sum(totals.values())
    return {
        "schema": FLEET_SCHEMA,
        "tool_version": __version__,
        "settings": settings or {},
        "lines": lines,
        "versions": versions,
        "summary": _summary(records, results, models_df, lines),
        "jobs": [_public_record(r) for r in sorted(records, key=lambda r: r["name"])],
        "models": _models_table(models_df, lines, results),
        "operators": _operators_table(ops_df, lines, fleet_time, len(results)),
        "dynamic_roots": _roots_table(roots_df),
        "upgrades": _upgrades(models_df, ops_df, lines, versions),
    }


def _public_record(record: dict) -> dict:
    keep = ("name", "kind", "model", "task", "status", "reason", "exit_code", "attempts", "duration_s",
            "started_at", "finished_at", "host", "readiness_score", "reused")
    out = {k: record.get(k) for k in keep}
    out["run_dir"] = f"jobs/{record['name']}"
    return out


def _summary(records, results, models_df, lines) -> dict:
    status: dict = {}
    for r in records:
        status[r.get("status", "failed")] = status.get(r.get("status", "failed"), 0) + 1
    ready = {}
    for line in lines:
        sub = models_df[models_df["line"] == line]
        ready[line] = int(sub["ready"].sum()) if len(sub) else 0
    return {"jobs": len(records), "assessed": len(results), "by_status": status,
            "failed": sorted(r["name"] for r in records if r.get("status") != "ok"),
            "ready_models": ready}


def _models_table(models_df, lines, results) -> list[dict]:
    rows = []
    for name in sorted(results):
        sub = models_df[models_df["model"] == name].set_index("line")
        result = results[name]
        row = {"model": name, "script": result.script, "complete": result.complete,
               "dynamic_root_causes": len(result.root_causes or []),
               "scan_target": result.target.version,
               "scan_score": result.summary.readiness_score, "per_line": {}}
        for line in lines:
            if line in sub.index:
                r = sub.loc[line]
                row["per_line"][line] = {"score": int(r["score"]), "ready": bool(r["ready"]),
                                         "blocking_ops": int(r["blocking_ops"]),
                                         "blocking_time_share": float(r["blocking_time_share"])}
        rows.append(row)
    return rows


def _operators_table(ops_df, lines, fleet_time: float, assessed: int) -> list[dict]:
    """One row per operator that blocks at least one model on at least one line."""
    if ops_df.empty:
        return []
    rows = []
    newest = lines[-1]
    for op, group in ops_df.groupby("op", sort=True):
        row = {"op": op, "per_line": {}}
        for line in lines:
            g = group[group["line"] == line]
            models = sorted(g["model"].unique())
            row["per_line"][line] = {
                "blocks": len(models), "models": models,
                "verdict": _worst(g["verdict"]) if len(g) else "ok",
                "time_share": round(float(g["time_us"].sum()) / fleet_time, 6) if fleet_time else 0.0,
                "substitute": next((s for s in g["substitute"] if isinstance(s, str) and s), None),
            }
        ref = row["per_line"][newest] if row["per_line"][newest]["blocks"] else \
            max(row["per_line"].values(), key=lambda v: v["blocks"])
        row["blocks_newest"] = row["per_line"][newest]["blocks"]
        row["blocks_max"] = max(v["blocks"] for v in row["per_line"].values())
        row["time_share"] = ref["time_share"]
        row["substitute"] = ref["substitute"] or next(
            (v["substitute"] for v in row["per_line"].values() if v["substitute"]), None)
        row["first_supported_in"] = next((s for s in group["first_supported_in"] if isinstance(s, str) and s), None)
        row["sources"] = sorted({s for s in group["source"] if isinstance(s, str)})[:5]
        rows.append(row)
    rows.sort(key=lambda r: (-r["blocks_newest"], -r["blocks_max"], -r["time_share"], r["op"]))
    return rows


def _worst(verdicts) -> str:
    from opscope.matrix.judge import RANK

    return max(verdicts, key=lambda v: RANK.get(v, 0))


def _roots_table(roots_df) -> list[dict]:
    if roots_df.empty:
        return []
    rows = []
    for kind, group in roots_df.groupby("kind", sort=True):
        rows.append({"kind": kind, "models": sorted(group["model"].unique()), "root_causes": int(len(group)),
                     "examples": [{"model": m, "source": s, "cause": c}
                                  for m, s, c in group[["model", "source", "cause"]].head(5).itertuples(index=False)]})
    rows.sort(key=lambda r: (-len(r["models"]), r["kind"]))
    return rows


def _upgrades(models_df, ops_df, lines, versions) -> list[dict]:
    """Each older line against the newest: models it unblocks, operators that stop blocking."""
    if len(lines) < 2 or models_df.empty:
        return []
    newest = lines[-1]
    ready_new = set(models_df[(models_df["line"] == newest) & models_df["ready"]]["model"])
    blocking_new = set(ops_df[ops_df["line"] == newest]["op"])
    out = []
    for line in lines[:-1]:
        ready_old = set(models_df[(models_df["line"] == line) & models_df["ready"]]["model"])
        old_ops = ops_df[ops_df["line"] == line]
        fixed = []
        for op, group in old_ops.groupby("op", sort=True):
            if op not in blocking_new:
                fixed.append({"op": op, "blocked_models": sorted(group["model"].unique()),
                              "verdict": _worst(group["verdict"])})
        fixed.sort(key=lambda f: (-len(f["blocked_models"]), f["op"]))
        out.append({"from": line, "to": newest, "from_version": versions[line], "to_version": versions[newest],
                    "unblocked_models": sorted(ready_new - ready_old),
                    "newly_blocked_models": sorted(ready_old - ready_new),
                    "operators_fixed": fixed,
                    "operators_newly_blocking": sorted(blocking_new - set(old_ops["op"]))})
    return out
