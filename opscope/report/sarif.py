"""Write findings as SARIF 2.1.0, so they show up in code-review tools (GitHub code scanning etc.).

Rule descriptions come from ``support_matrix/cuda_api_rules.yaml``; file paths are
written relative to the SARIF file's base (``%SRCROOT%``) when they are relative.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opscope.version import __version__

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _rule_descriptors(findings) -> list[dict]:
    from opscope.analysis.static.scan import load_rules
    rules = load_rules()
    out, seen = [], set()
    for finding in findings:
        if finding.rule in seen:
            continue
        seen.add(finding.rule)
        rule = rules.by_id(finding.rule)
        text = rule.message.split(":")[0] if rule else finding.rule.replace("-", " ")
        help_text = f"NPU replacement: {rule.replacement}" if rule and rule.replacement else \
            "The file could not be parsed, so it was not checked." if finding.rule == "parse-error" else finding.message
        out.append({
            "id": finding.rule,
            "name": "".join(p.capitalize() for p in finding.rule.split("-")),
            "shortDescription": {"text": text.replace("{name}", "CUDA API").replace("{value}", "value")},
            "help": {"text": help_text},
            "defaultConfiguration": {"level": _LEVELS.get(rule.severity if rule else finding.severity, "warning")},
        })
    return out


def _uri(file: str) -> tuple[str, bool]:
    path = Path(file)
    if path.is_absolute():
        return path.as_uri(), False
    return path.as_posix(), True


def to_sarif(findings) -> dict:
    """The SARIF log (a dict) for ``findings`` (opscope.model.Finding objects)."""
    findings = list(findings)
    rule_index = {}
    descriptors = _rule_descriptors(findings)
    for i, d in enumerate(descriptors):
        rule_index[d["id"]] = i
    results = []
    for f in findings:
        text = f.message + (f". Replace with: {f.replacement}" if f.replacement else "")
        result = {
            "ruleId": f.rule,
            "ruleIndex": rule_index[f.rule],
            "level": _LEVELS.get(f.severity, "warning"),
            "message": {"text": text},
            "properties": {"api": f.api, "origin": f.origin, "count": int(f.count or 1)},
        }
        if f.file:
            uri, relative = _uri(f.file)
            location: dict[str, Any] = {"artifactLocation": {"uri": uri}}
            if relative:
                location["artifactLocation"]["uriBaseId"] = "%SRCROOT%"
            if f.line:
                region: dict[str, Any] = {"startLine": int(f.line)}
                if f.column:
                    region["startColumn"] = int(f.column)
                if f.snippet:
                    region["snippet"] = {"text": f.snippet}
                location["region"] = region
            result["locations"] = [{"physicalLocation": location}]
        results.append(result)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "opscope",
                "version": __version__,
                "rules": descriptors,
            }},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }


def write_sarif(findings, path: Path) -> Path:
    """Write ``findings`` to ``path`` as SARIF 2.1.0; returns the path written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_sarif(findings), indent=1), encoding="utf-8")
    return path
