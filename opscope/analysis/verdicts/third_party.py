"""Verdicts for operators third-party libraries register with the dispatcher (``torchvision::roi_align``).

torch_npu's matrix covers ATen and its own ops; a library's ops get Ascend's own answer from
``support_matrix/third_party.yaml``: an adapter package that registers NPU kernels for them (``adapter``,
with the adapter release that pairs with the target torch_npu), torch_npu's CPU fallback for a dispatcher
op without an NPU kernel (``cpu-fallback``), or nothing (``unsupported``).  A namespace the file does not
know stays ``unknown`` in ``verdicts/support.py``.
"""
from __future__ import annotations

import re

from opscope.knowledge import load_optional
from opscope.matrix.judge import Judgement
from opscope.model import LibraryOp, ThirdPartyLibrary


def _library_of(namespace: str) -> tuple[str, dict] | None:
    for name, library in (load_optional("third_party.yaml").get("libraries") or {}).items():
        names = library.get("namespace")
        if namespace == names or (isinstance(names, list) and namespace in names):   # one, or a list (xformers)
            return name, library
    return None


def _version_key(version: str) -> tuple:
    """``2.1.0.post13`` -> (2, 1, 0, 13): the order of torch_npu releases."""
    parts = re.findall(r"\d+", version)
    return tuple(int(p) for p in parts[:3]) + (int(parts[3]) if len(parts) > 3 else 0,)


def adapter_release(adapter: dict, torch_npu: str) -> tuple[dict | None, str]:
    """The adapter release to install with torch_npu ``torch_npu``, and how it was chosen.

    Ascend's table pairs each tag with one torch_npu release; another post-release of the same torch
    (``2.1.0.post17``) takes the newest tag of that torch, said so.  No tag for that torch: None.
    """
    releases = adapter.get("releases")
    if releases is None:   # no release table: one source build, said so
        return {"tag": "(source build)"}, f"no release table: {adapter.get('install', 'built from source')}"
    exact = [r for r in releases if r["torch_npu"] == torch_npu]
    if exact:
        return exact[0], f"Ascend's table pairs it with torch_npu {torch_npu}"
    torch_line = _version_key(torch_npu)[:3]
    same = sorted((r for r in releases if _version_key(r["torch_npu"])[:3] == torch_line),
                  key=lambda r: _version_key(r["torch_npu"]), reverse=True)
    if same:
        return same[0], (f"Ascend's table pairs it with torch_npu {same[0]['torch_npu']}, the newest paired "
                         f"release of the torch {'.'.join(map(str, torch_line))} that torch_npu {torch_npu} is "
                         "built for")
    lines = sorted({r["torch_npu"] for r in releases}, key=_version_key)
    return None, (f"{adapter['package']} has no release for torch_npu {torch_npu} (its releases pair with "
                  f"torch_npu {', '.join(lines)})")


def _sourced(data: dict, entry: dict) -> str:
    source = (data.get("sources") or {}).get(entry.get("source"), {})
    pin = str(source.get("commit", ""))[:8] or str(source.get("version", ""))
    thread = f"#{source['issue']}" if source.get("issue") else ""   # an issue or pull-request thread
    repo = f"{source.get('repo')}{thread or '@' + pin}" if source else entry.get("source", "")
    return f"{repo} {entry.get('at', '')}".strip()


def judge_third_party(name: str, torch_npu: str) -> Judgement | None:
    """The verdict of ``namespace::op`` from ``third_party.yaml`` for torch_npu ``torch_npu``; None when the
    file does not know the namespace."""
    namespace, _, op = name.rpartition("::")
    known = _library_of(namespace)
    if known is None:
        return None
    library_name, library = known
    data = load_optional("third_party.yaml")
    entry = (library.get("ops") or {}).get(op)
    without = library.get("without") or {}
    evidence: dict = {"list": "support_matrix/third_party.yaml", "library": library_name,
                      "version": torch_npu, "without": without.get("text", ""),
                      "without_source": _sourced(data, without) if without else ""}
    if entry is None:
        default = library.get("default") or {"verdict": "unknown", "detail": "not in the file"}
        if default["verdict"] != "adapter":
            return Judgement(default["verdict"], {**evidence, "rule": "third-party-default",
                                                  "detail": f"{name}: {default.get('detail', '')}"})
        entry = default   # the library's answer for every op (triton: triton-ascend compiles its kernels)
    evidence.update({"rule": "third-party", "source": _sourced(data, entry)})
    for key in ("kernel", "caveat", "detail", "via", "inferred", "why"):   # inferred: read from code, with why
        if entry.get(key):
            evidence[key] = entry[key]
    if entry["verdict"] != "adapter":
        # composite: the library's own torch code runs on the NPU (bitsandbytes' default kernels): its children
        # are the ops that run there, judged on their own
        return Judgement(entry["verdict"], evidence, "decomposes" if entry["verdict"] == "composite" else "kernel")
    adapter = library.get("adapter") or {}
    release, how = adapter_release(adapter, torch_npu)
    evidence.update({"adapter": adapter.get("package"), "adapter_source": _sourced(data, adapter), "paired": how})
    if release is None:   # the adapter cannot be installed with this torch_npu: torch_npu's answer stands
        verdict = without.get("verdict", "cpu-fallback")   # unsupported where nothing falls back (triton)
        return Judgement(verdict, {**evidence, "rule": "third-party-no-adapter-release",
                                   "detail": f"{how}: {without.get('text', 'no NPU kernel')}"})
    built = release.get("tag") == "(source build)"
    evidence.update({"install": adapter.get("name", adapter["package"]) if built else f"{adapter['package']} "
                                                                                       f"{release['tag']}",
                     "adapter_release": release,
                     "activate": adapter.get("activate", "")})
    return Judgement("adapter", evidence)


def version_here(library: str) -> str | None:
    """The installed distribution's version (``flash_attn`` finds ``flash-attn``); None when not installed."""
    from importlib import metadata
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def library_rows(operators, findings, op_time) -> list[ThirdPartyLibrary]:
    """One row per third-party library the scan judged: its version here (or that opscope stood in for it),
    what to install on the Ascend machine for the target, and its operators with verdict and time share.

    ``op_time(op)`` is an operator's time (the readiness summary's basis, ``verdicts.op_time_basis``)."""
    total = sum(op_time(op) for op in operators) or 0.0
    stood_in = {str(f.api).split()[1] for f in findings if f.rule == "library-stand-in" and len(str(f.api).split()) > 1}
    rows: dict[str, dict] = {}
    for op in operators:
        evidence = op.evidence if isinstance(op.evidence, dict) else {}
        if not str(evidence.get("rule", "")).startswith("third-party") or op.verdict == "not-applicable":
            continue
        library = str(evidence.get("library"))
        row = rows.setdefault(library, {"library": library, "install": None, "paired": None, "ops": {},
                                        "time_share": 0.0, "stand_in": library in stood_in})
        if evidence.get("install"):
            row["install"], row["paired"] = evidence["install"], evidence.get("paired")
        share = op_time(op) / total if total else 0.0
        entry = row["ops"].setdefault(op.name, {"name": op.name, "verdict": op.verdict, "time_share": 0.0})
        entry["time_share"] += share
        row["time_share"] += share
    out = []
    for library, row in sorted(rows.items(), key=lambda kv: -kv[1]["time_share"]):
        ops = [LibraryOp(name=e["name"], verdict=e["verdict"], time_share=round(e["time_share"], 6))
               for e in sorted(row["ops"].values(), key=lambda e: -e["time_share"])]
        out.append(ThirdPartyLibrary(
            library=library, install=row["install"], paired=row["paired"], ops=ops,
            time_share=round(row["time_share"], 6), stand_in=row["stand_in"],
            version_here="not installed: opscope's stand-in ran" if row["stand_in"] else version_here(library) or "unknown"))
    return out
