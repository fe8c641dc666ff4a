"""The CUDA-API rule set of the static scan, as data: ``support_matrix/cuda_api_rules.yaml``.

Loaded through ``opscope.knowledge`` (its declared schema: a misspelt key is an error, not a
silently dropped rule) and compiled once into ``RuleSet`` (fnmatch patterns as regexes, the
keywords that let a file with none of them skip the parse).  ``static_scan``, ``migrate`` and
the SARIF writer read the same rule set.
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field
from typing import overload

from opscope.knowledge import load, load_path

RULES_FILE = "cuda_api_rules.yaml"


@dataclass(frozen=True)
class Rule:
    """One entry of cuda_api_rules.yaml (see the file's header for the fields)."""
    id: str
    severity: str
    message: str
    replacement: str | None
    names: tuple = ()
    methods: tuple = ()
    attributes: tuple = ()
    strings: tuple = ()
    imports: tuple = ()
    files: tuple = ()
    cpp: bool = False
    where: dict | None = None
    rewrite: str | None = None
    context: str | None = None
    exclude: tuple = ()
    flows: tuple = ()                  # string rules: where the literal must flow (device, compare)
    judgement: str | None = None       # why `opscope migrate` leaves it to a person
    rewrite_to: str | None = None      # `rewrite: rename`: the new last name of the reference
    name_regexes: tuple = field(default=(), compare=False)
    exclude_regexes: tuple = field(default=(), compare=False)
    string_regexes: tuple = field(default=(), compare=False)

    def tail_of(self, qualname: str) -> str:
        """What ``{tail}`` stands for: the part a trailing ``*`` matched, else the name after torch.cuda."""
        for pattern in self.names:
            if "*" in pattern and fnmatch.fnmatchcase(qualname, pattern):
                head = pattern.split("*", 1)[0].rsplit(".", 1)[0]
                return qualname[len(head) + 1:]
        if qualname.startswith("torch.cuda."):
            return qualname[len("torch.cuda."):]
        return qualname.rsplit(".", 1)[-1]

    def matches_name(self, qualname: str) -> bool:
        return any(rx.fullmatch(qualname) for rx in self.name_regexes) \
            and not any(rx.fullmatch(qualname) for rx in self.exclude_regexes)

    def matches_string(self, text: str) -> bool:
        return any(rx.fullmatch(text) for rx in self.string_regexes)

    def matches_import(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, p) for p in self.imports)

    @overload
    def render(self, template: str, **values) -> str: ...
    @overload
    def render(self, template: None, **values) -> None: ...
    @overload
    def render(self, template: str | None, **values) -> str | None: ...

    def render(self, template: str | None, **values) -> str | None:
        if template is None:
            return None
        for key, value in values.items():
            template = template.replace("{" + key + "}", str(value))
        return template


FLOW_KINDS = ("device", "compare")


@dataclass(frozen=True)
class FlowSpec:
    """The `device_flow` section of the rules file: what reads a value as a device."""
    calls: tuple = ()              # resolved names (globs) whose every argument is a device sink
    methods: frozenset = frozenset()           # methods (any object) whose every argument is one
    kwargs: frozenset = frozenset()            # keywords that are one in any call
    names: tuple = ()              # globs: a variable/attribute/key/option so named holds a device
    compare_methods: frozenset = frozenset()   # `s.startswith('cuda')` compares like `==`
    call_regexes: tuple = field(default=(), compare=False)
    name_regexes: tuple = field(default=(), compare=False)

    def is_sink_call(self, qualname: str) -> bool:
        return any(rx.fullmatch(qualname) for rx in self.call_regexes)

    def is_device_name(self, ident: str) -> bool:
        return any(rx.fullmatch(ident.lower()) for rx in self.name_regexes)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple
    safe_npu_members: frozenset
    keywords: re.Pattern           # a Python file without any of these cannot match a rule
    roots: frozenset               # first components of every `names` pattern (torch, apex)
    flow: FlowSpec = field(default_factory=FlowSpec)
    flow_tokens: re.Pattern = re.compile("(?!)")   # a literal without these matches no `flows` rule
    name_cache: dict = field(default_factory=dict, compare=False, hash=False)  # qualname -> rules

    def name_rules(self, qualname: str) -> list:
        """Rules with a `names` pattern matching ``qualname`` (memoised: names repeat a lot)."""
        cached = self.name_cache.get(qualname)
        if cached is None:
            cached = [r for r in self.rules if r.names and r.matches_name(qualname)] \
                if qualname.split(".", 1)[0] in self.roots else []
            self.name_cache[qualname] = cached
        return cached

    def by_id(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def _token(pattern: str, where: dict | None) -> str:
    if where and where.get("is") in ("cuda", "nccl"):
        return where["is"]
    if where and where.get("is") == "truthy" and where.get("kwarg"):
        return where["kwarg"]
    parts = [p.strip("*?[]") for p in pattern.split(".")[1:]] or [pattern]
    parts = [p for p in parts if p] or [pattern.split(".")[0]]
    return max(parts, key=len)


def _build(data: dict) -> RuleSet:
    rules, tokens, roots = [], set(), set()
    flow_tokens = set()
    for raw in data.get("rules", []):
        names = tuple(raw.get("names", ()))
        strings = tuple(raw.get("strings", ()))
        imports = tuple(raw.get("imports", ()))
        methods = tuple(raw.get("methods", ()))
        attributes = tuple(raw.get("attributes", ()))
        where = raw.get("where")
        flows = tuple(raw.get("flows", ()))
        if any(f not in FLOW_KINDS for f in flows) or (flows and not strings):
            raise ValueError(f"rule {raw['id']}: `flows` takes {', '.join(FLOW_KINDS)} and needs `strings`")
        rule = Rule(
            id=raw["id"], severity=raw.get("severity", "warning"), message=raw["message"],
            replacement=raw.get("replacement"), names=names, methods=methods, attributes=attributes,
            strings=strings,
            imports=imports, files=tuple(raw.get("files", ())), cpp=bool(raw.get("cpp")),
            where=where, rewrite=raw.get("rewrite"), context=raw.get("context"),
            exclude=tuple(raw.get("exclude", ())), flows=flows, judgement=raw.get("judgement"),
            rewrite_to=raw.get("rewrite_to"),
            name_regexes=tuple(re.compile(fnmatch.translate(p)) for p in names),
            exclude_regexes=tuple(re.compile(fnmatch.translate(p)) for p in raw.get("exclude", ())),
            string_regexes=tuple(re.compile(p) for p in strings),
        )
        rules.append(rule)
        for pattern in names:
            tokens.add(_token(pattern, where))
            roots.add(pattern.split(".")[0])
        for method in methods:
            tokens.add(_token(method, where) if where else method)
        tokens.update(attributes)
        for pattern in strings:
            tokens.add(max(re.findall(r"[A-Za-z_]{3,}", pattern) or [pattern], key=len))
            if flows:
                flow_tokens.add(max(re.findall(r"[A-Za-z_]{3,}", pattern) or [pattern], key=len))
        for pattern in imports:
            tokens.add(pattern.split(".")[0].strip("*"))
    keywords = re.compile("|".join(sorted(re.escape(t) for t in tokens if t)))
    raw_flow = data.get("device_flow") or {}
    flow = FlowSpec(calls=tuple(raw_flow.get("calls", ())), methods=frozenset(raw_flow.get("methods", ())),
                    kwargs=frozenset(raw_flow.get("kwargs", ())), names=tuple(raw_flow.get("names", ())),
                    compare_methods=frozenset(raw_flow.get("compare_methods", ())),
                    call_regexes=tuple(re.compile(fnmatch.translate(p)) for p in raw_flow.get("calls", ())),
                    name_regexes=tuple(re.compile(fnmatch.translate(p.lower())) for p in raw_flow.get("names", ())))
    return RuleSet(rules=tuple(rules), safe_npu_members=frozenset(data.get("safe_npu_members", ())),
                   keywords=keywords, roots=frozenset(roots), flow=flow,
                   flow_tokens=re.compile("|".join(sorted(re.escape(t) for t in flow_tokens)) or "(?!)"))


@functools.cache
def load_rules(path: str | None = None) -> RuleSet:
    """The rule set from ``path`` (default: the shipped support_matrix file)."""
    return _build(load_path(path, RULES_FILE) if path else load(RULES_FILE))
