"""Judge one ATen operator against one torch_npu release: verdict plus the evidence chain.

Order of questions (each answer is recorded in the evidence):

1. Is the overload registered for the NPU in that release?  -> ``native``.
2. Is it ``structured_delegate``/``structured_inherit`` to an overload that is?  -> ``composite``.
3. Is it a Composite* kernel (implemented with other operators)?  -> ``composite`` if every
   child is supported, else as weak as its weakest child (children: those observed in the
   scan; for CompositeExplicit ops without observation, the op's explicit ``.out`` form).
4. Otherwise the NPU has no kernel: ``cpu-fallback`` when torch has a CPU kernel to fall
   back to, ``unsupported`` when it has none (sparse-, quantized-, CUDA-only ops).

A name is never enough: every verdict names the lists checked and the dispatch keys found.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from opscope.matrix.store import SupportMatrix, plugin_lines_of
from opscope.matrix.torch_schema import OverloadInfo, TorchSchema

RANK = {"native": 0, "composite": 1, "adapter": 1, "not-applicable": 1, "unknown": 2, "cpu-fallback": 3,
        "unsupported": 4}
GOOD = ("native", "composite")
FOREIGN_DECOMPOSITION = "observed under another torch; not this torch's path"


@dataclass
class Judgement:
    verdict: str
    evidence: dict = field(default_factory=dict)
    # "kernel": one NPU (or CPU-fallback) kernel runs the whole op, so children never run as such;
    # "decomposes": the op runs as its children, which need support themselves
    kind: str = "kernel"


class Judge:
    """Memoised judgements for one release line; ``children_of`` gives observed decompositions."""

    def __init__(self, matrix: SupportMatrix, schema: TorchSchema, line: str,
                 children_of: Callable[[str], list] | None = None, release=None, schema_note: str | None = None):
        """``release``: the exact torch_npu release (default: the line's newest); ``schema``: the
        facts of the torch it was built for; ``schema_note`` says so when they are another torch's."""
        self.matrix, self.schema, self.line = matrix, schema, line
        self.release = release or matrix.release(line)
        self.schema_note = schema_note
        self.children_of = children_of or (lambda name: [])
        self._memo: dict = {}
        self._stack: set = set()

    # ---- public --------------------------------------------------------------------
    def judge(self, name: str, overload: str | None = None) -> Judgement:
        """Judge 'aten::gelu' (overload None: by overload family) or a given overload."""
        key = (name, overload)
        if key not in self._memo:
            if key in self._stack:  # a decomposition that comes back to itself: judged by the caller
                return Judgement("composite", {"rule": "recursion", "detail": f"{name} re-enters itself"},
                                 "decomposes")
            self._stack.add(key)
            try:
                self._memo[key] = self._judge(name, overload)
            finally:
                self._stack.discard(key)
        return self._memo[key]

    def judge_observed(self, name: str, overload: str | None, children: list,
                       child_judge: Callable[[str, str | None], Judgement]) -> Judgement:
        """Judge one observed signature: its own children, each judged by ``child_judge``.

        Signatures of one op name can decompose differently (a dense and a sparse
        ``aten::t``), so a scan judges every signature with the children seen under it.
        """
        return self._judge(name, overload, (list(children), child_judge))

    # ---- internals -----------------------------------------------------------------
    def _base_evidence(self) -> dict:
        evidence = {"list": "torch_npu registrations" if self.release.from_wheel else "op-plugin yaml",
                    "version": self.release.version, "torch_schema": self.schema.source}
        if self.schema_note:
            evidence["torch_schema_note"] = self.schema_note
        return evidence

    def _judge(self, name: str, overload: str | None, observed=None) -> Judgement:
        base = name.split("::", 1)[1] if "::" in name else name
        if overload is not None:
            return self._judge_overload(name, base, overload, observed)
        candidates = self._family(base)
        if not candidates:
            if base in self.release.families():
                overloads = self.release.families()[base]
                return Judgement("native", {**self._base_evidence(), "rule": "registered",
                                            "matched": [_key(base, o) for o in overloads]})
            return Judgement("unknown", {**self._base_evidence(), "rule": "not-in-torch-schema",
                                         "detail": f"{name} is neither in {self.schema.source} nor registered "
                                                   f"in torch_npu {self.release.version}: cannot judge it"
                                                   + self._newer_torch_hint(base)}, "decomposes")
        judged = [(o, self._judge_overload(name, base, o, observed)) for o in candidates]
        best_overload, best = min(judged, key=lambda oj: RANK[oj[1].verdict])
        evidence = dict(best.evidence)
        if len(candidates) > 1:
            evidence["overload"] = (f"not recorded: judged by the overload family "
                                    f"({', '.join(_key(base, o) for o in candidates)}); "
                                    f"best match {_key(base, best_overload)}")
            evidence["matched"] = [_key(base, o) for o, j in judged if j.verdict == best.verdict]
        return Judgement(best.verdict, evidence, best.kind)

    def _member(self, base: str, overload: str) -> OverloadInfo:
        info = self.schema.get(base, overload)
        assert info is not None   # a family lists only overloads the schema has
        return info

    def _family(self, base: str) -> list[str]:
        overloads = self.schema.families.get(base, [])
        plain = [o for o in overloads if not self._member(base, o).is_out]
        return plain or list(overloads)

    def _judge_overload(self, name: str, base: str, overload: str, observed=None) -> Judgement:
        key = _key(base, overload)
        registered = self.release.aten.get(key)
        if registered:
            return Judgement("native", {**self._base_evidence(), "rule": "registered", "entry": key,
                                        "section": registered})
        info = self.schema.get(base, overload)
        checked = [f"{self.release.source}: {key} not registered"] + self._plugin_status(key)
        if info is None:
            return Judgement("unknown", {**self._base_evidence(), "rule": "not-in-torch-schema", "checked": checked,
                                         "detail": f"{key} is not in {self.schema.source}"
                                                   + self._newer_torch_hint(base)}, "decomposes")
        plugin = self.matrix.plugin.get(key)
        delegate = info.structured_delegate or (plugin.inherit if plugin else None)
        if delegate:
            delegate_base, _, delegate_overload = delegate.partition(".")
            target = self.judge(f"{name.rpartition('::')[0] or 'aten'}::{delegate_base}", delegate_overload)
            how = "structured_delegate" if info.structured_delegate else "structured_inherit (op-plugin)"
            path = [key, delegate] + list(target.evidence.get("path", [])[1:])
            if target.verdict in GOOD:
                return Judgement("composite", {**self._base_evidence(), "rule": f"{how} -> {delegate}",
                                               "path": path, "delegate": _brief(target.evidence)}, "kernel")
            return Judgement(target.verdict, {**target.evidence, "rule": f"{how} -> {delegate}: "
                                              f"{target.evidence.get('rule')}", "path": path,
                                              "checked": checked + target.evidence.get("checked", [])},
                             target.kind)
        if info.composite_implicit or info.composite_explicit:
            return self._decomposition(name, base, key, info, checked, observed)
        return self._no_kernel(key, info, checked)

    def _decomposition(self, name, base, key, info, checked, observed=None) -> Judgement:
        dispatch_key = "CompositeImplicitAutograd" if info.composite_implicit else \
            next(k for k in info.dispatch if k.startswith("CompositeExplicit"))
        evidence = {**self._base_evidence(), "rule": dispatch_key, "dispatch": list(info.dispatch),
                    "checked": checked}
        children, child_judge = observed if observed is not None else (self.children_of(name), self.judge)
        how = "observed in the scan"
        if not children and info.composite_explicit:
            outs = [o for o in self.schema.families.get(base, []) if self._member(base, o).is_out
                    and not self._member(base, o).composite_explicit]
            if outs:
                children = [f"{name}.{outs[0]}"]  # judged as base.out below
                how = f"the explicit kernel writes through {base}.{outs[0]}"
        if not children:
            evidence["detail"] = (f"{key} is implemented with other operators for every backend; its "
                                  "decomposition was not observed, so its children are not checked")
            evidence["path"] = [key]
            return Judgement("composite", evidence, "decomposes")
        results = []
        for child in children:
            child_name, child_overload = _split(child)
            if child_name == name and not child_overload:  # the same name below itself: its out= form
                outs = [o for o in self.schema.families.get(base, []) if self._member(base, o).is_out]
                child_overload = outs[0] if outs else ""
            judged = child_judge(child_name, child_overload or None)
            short = child_name.rpartition("::")[2]
            results.append((short + (f".{child_overload}" if child_overload else ""), judged))
        worst_name, worst = max(results, key=lambda r: RANK[r[1].verdict])
        evidence["children"] = {c: j.verdict for c, j in results}
        evidence["decomposition"] = how
        if worst.verdict in ("unsupported", "unknown") and how == "observed in the scan" and self._foreign_schema():
            # The scan ran another torch.  On the torch this release is built for, a child with no CPU
            # kernel (or absent) cannot be on the CPU path of this composite op, so that torch decomposes
            # it differently: the observed children say nothing about it.
            evidence["detail"] = (f"{key} is implemented with other operators for every backend; the decomposition "
                                  f"observed under the scanning torch goes through {worst_name}, which "
                                  f"{self.schema.source} has no CPU path for, so that torch decomposes it "
                                  "differently: its children are not checked")
            evidence["decomposition"] = FOREIGN_DECOMPOSITION
            evidence["path"] = [key]
            return Judgement("composite", evidence, "decomposes")
        if worst.verdict in GOOD:
            evidence["path"] = [key] + [c for c, _ in results]
            return Judgement("composite", evidence, "decomposes")
        evidence.update({"path": [key, worst_name] + list(worst.evidence.get("path", [])[1:]),
                         "weakest_child": {"op": worst_name, "verdict": worst.verdict, **_brief(worst.evidence)},
                         "detail": f"decomposes into {worst_name}, which is {worst.verdict}"})
        evidence["rule"] = f"{dispatch_key}: weakest child {worst.verdict}"
        if worst.evidence.get("first_supported_in"):
            evidence["first_supported_in"] = worst.evidence["first_supported_in"]
        return Judgement(worst.verdict, evidence, "decomposes")

    def _no_kernel(self, key, info, checked) -> Judgement:
        evidence = {**self._base_evidence(), "dispatch": list(info.dispatch),
                    "checked": checked + [f"{self.schema.source}: dispatch {', '.join(info.dispatch)} "
                                          "(no Composite kernel, no structured delegate)"],
                    "path": [key]}
        if info.has_cpu_kernel:
            evidence["rule"] = "no-npu-kernel"
            evidence["detail"] = ("torch_npu runs it on the CPU with host<->device copies "
                                  "(an error with TORCH_NPU_FALLBACK_CPU_DISABLE=1)")
            verdict = "cpu-fallback"
        else:
            evidence["rule"] = "no-npu-kernel"
            evidence["detail"] = ("no NPU kernel and torch has no CPU kernel to fall back to "
                                  f"(dispatch keys: {', '.join(info.dispatch) or 'none'})")
            verdict = "unsupported"
        newer = self._first_supported_after(key)
        if newer:
            evidence["first_supported_in"] = newer
        elsewhere = [line for line, rel in self.matrix.releases.items() if key in rel.aten]
        if elsewhere:
            evidence["registered_in_lines"] = elsewhere
        return Judgement(verdict, evidence, "kernel")

    def _foreign_schema(self) -> bool:
        from opscope.matrix.torch_schema import load_torch_schema
        return load_torch_schema().source != self.schema.source

    def _newer_torch_hint(self, base: str) -> str:
        """When the scanning torch has the op but the torch this release is built for does not."""
        from opscope.matrix.torch_schema import load_torch_schema
        installed = load_torch_schema()
        if installed.source == self.schema.source or base not in installed.families:
            return ""
        return (f" (the torch torch_npu {self.release.version} is built for); the scanning {installed.source} "
                "has it: with that torch the calling code takes another path or fails - check the API exists there")

    def _plugin_status(self, key: str) -> list[str]:
        entry = self.matrix.plugin.get(key)
        if entry is None:
            return [f"op-plugin yaml: no entry for {key}"]
        lines = plugin_lines_of(entry, self.matrix.plugin_lines)
        state = "implemented" if self.line in lines else "not implemented"
        return [f"op-plugin yaml: {key} {state} for {self.line} (acl_op={entry.acl_op or '-'}, "
                f"op_api={entry.op_api or '-'})"]

    def _first_supported_after(self, key: str) -> str | None:
        """The first exact release after this one that registers ``key`` (a post-release counts)."""
        from opscope.matrix.versions import version_key
        mine = version_key(self.release.version)
        for version in self.matrix.versions:
            if version_key(version) > mine and key in self.matrix.exact[version].aten:
                return f"torch_npu {version}"
        return None


def _key(base: str, overload: str) -> str:
    return f"{base}.{overload}" if overload else base


def _split(qualified: str) -> tuple[str, str]:
    """'aten::add.out' -> ('aten::add', 'out'); 'aten::t' -> ('aten::t', '')."""
    ns, sep, rest = qualified.rpartition("::")
    base, _, overload = rest.partition(".")
    return f"{ns}{sep}{base}", overload


def _brief(evidence: dict) -> dict:
    """The deciding facts of a nested judgement (kept short for reports)."""
    keys = ("rule", "entry", "section", "dispatch", "first_supported_in")
    return {k: evidence[k] for k in keys if evidence.get(k)}
