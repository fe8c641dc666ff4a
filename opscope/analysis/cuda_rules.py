"""Load ``support_matrix/cuda_api_rules.yaml``: the CUDA->NPU knowledge the static scan applies.

Kept apart from the scanner so the migrate command and the SARIF writer read the same
rules (ids, severities, messages, which rewrites are safe) without an AST in sight.
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field

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
    strings: tuple = ()
    imports: tuple = ()
    files: tuple = ()
    cpp: bool = False
    where: dict | None = None
    rewrite: str | None = None
    context: str | None = None
    name_regexes: tuple = field(default=(), compare=False)
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
        return any(rx.fullmatch(qualname) for rx in self.name_regexes)

    def matches_string(self, text: str) -> bool:
        return any(rx.fullmatch(text) for rx in self.string_regexes)

    def matches_import(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, p) for p in self.imports)

    def render(self, template: str | None, **values) -> str | None:
        if template is None:
            return None
        for key, value in values.items():
            template = template.replace("{" + key + "}", str(value))
        return template


@dataclass(frozen=True)
class RuleSet:
    rules: tuple
    safe_npu_members: frozenset
    keywords: re.Pattern           # a Python file without any of these cannot match a rule
    roots: frozenset               # first components of every `names` pattern (torch, apex)

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
    for raw in data.get("rules", []):
        names = tuple(raw.get("names", ()))
        strings = tuple(raw.get("strings", ()))
        imports = tuple(raw.get("imports", ()))
        methods = tuple(raw.get("methods", ()))
        where = raw.get("where")
        rule = Rule(
            id=raw["id"], severity=raw.get("severity", "warning"), message=raw["message"],
            replacement=raw.get("replacement"), names=names, methods=methods, strings=strings,
            imports=imports, files=tuple(raw.get("files", ())), cpp=bool(raw.get("cpp")),
            where=where, rewrite=raw.get("rewrite"), context=raw.get("context"),
            name_regexes=tuple(re.compile(fnmatch.translate(p)) for p in names),
            string_regexes=tuple(re.compile(p) for p in strings),
        )
        rules.append(rule)
        for pattern in names:
            tokens.add(_token(pattern, where))
            roots.add(pattern.split(".")[0])
        for method in methods:
            tokens.add(_token(method, where) if where else method)
        for pattern in strings:
            tokens.add(max(re.findall(r"[A-Za-z_]{3,}", pattern) or [pattern], key=len))
        for pattern in imports:
            tokens.add(pattern.split(".")[0].strip("*"))
    keywords = re.compile("|".join(sorted(re.escape(t) for t in tokens if t)))
    return RuleSet(rules=tuple(rules), safe_npu_members=frozenset(data.get("safe_npu_members", ())),
                   keywords=keywords, roots=frozenset(roots))


@functools.lru_cache(maxsize=None)
def load_rules(path: str | None = None) -> RuleSet:
    """The rule set from ``path`` (default: the shipped support_matrix file)."""
    import yaml
    from pathlib import Path

    from opscope.resources import support_matrix_dir
    file = Path(path) if path else support_matrix_dir() / RULES_FILE
    with open(file, encoding="utf-8") as fh:
        return _build(yaml.safe_load(fh))
