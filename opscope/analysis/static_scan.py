"""Find every CUDA-specific API in a project's source without running it.

The part of opscope that works when the script cannot run.  Python files are parsed
with ``ast``; imports and simple aliases are resolved per scope, so ``t.cuda.synchronize()``
after ``import torch as t`` is found while a user function that is merely called
``cuda`` is not.  Whether a ``'cuda'`` string names a device is decided by where it flows
(``_Flow``: into a torch call, ``.to()``, a ``device=`` keyword, or a variable / attribute /
dict key / argparse option read so), so a TVM target or a log message is no finding and a
comparison is only advice; ``**kwargs`` dicts are followed the same way into the calls a rule
tests (``DataLoader(**kwargs)`` with ``pin_memory=True`` inside).
What counts as CUDA-specific, and what replaces it, is data:
``support_matrix/cuda_api_rules.yaml`` (``load_rules``; the migrate command and the
SARIF writer read the same rule set).
C/C++/CUDA sources are checked for CUDA kernels and custom-op registrations.

``scan_source`` returns ``Hit`` objects that also carry the exact edits a safe
mechanical rewrite would make; ``opscope.analysis.migrate`` applies those.
"""
from __future__ import annotations

import ast
import fnmatch
import functools
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from opscope.model import Finding

PY_SUFFIXES = (".py",)
CPP_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx")
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", "node_modules",
                       ".tox", ".nox", ".eggs", ".mypy_cache", ".pytest_cache", "site-packages", "build", "dist"})
DEVICE_RX = re.compile(r"cuda(:\d+)?")

@dataclass
class Edit:
    """Replace ``old`` by ``new`` on one line, between byte columns (the AST's offsets)."""
    line: int
    start: int
    end: int
    old: str
    new: str


@dataclass
class Hit:
    """A rule matched at a place in a file: the finding plus the edits a safe rewrite makes."""
    rule: Rule
    line: int
    column: int             # 1-based, in characters
    api: str
    message: str
    replacement: str | None
    edits: list = field(default_factory=list)
    unsafe_reason: str | None = None   # why `opscope migrate` leaves it alone (None: it is rewritten)

    def to_finding(self, file: str, lines: list[str]) -> Finding:
        snippet = lines[self.line - 1].strip() if 0 < self.line <= len(lines) else None
        return Finding(rule=self.rule.id, file=file, line=self.line, column=self.column, api=self.api,
                       message=self.message, replacement=self.replacement, severity=self.rule.severity,
                       snippet=snippet, origin="static")


# --------------------------------------------------------------------------- rules
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
    from pathlib import Path

    import yaml

    from opscope.resources import support_matrix_dir
    file = Path(path) if path else support_matrix_dir() / RULES_FILE
    with open(file, encoding="utf-8") as fh:
        return _build(yaml.safe_load(fh))


# --------------------------------------------------------------------------- scopes
class _Scope:
    __slots__ = ("parent", "is_class", "imports", "aliases", "locals", "globals")

    def __init__(self, parent, is_class=False):
        self.parent = parent
        self.is_class = is_class
        self.imports: dict[str, str] = {}
        self.aliases: dict[str, ast.expr] = {}
        self.locals: set[str] = set()
        self.globals: set[str] = set()


class _Binder(ast.NodeVisitor):
    """First pass: which names each scope binds, and to what (import, alias or local)."""

    def __init__(self):
        self.scopes: dict[int, _Scope] = {}
        self.stack: list[_Scope] = []
        self.assigned: dict[tuple[int, str], int] = {}
        self.functions: dict[tuple[int, str], ast.AST] = {}   # (id(binding scope), name) -> def / class

    def _enter(self, node, is_class=False):
        scope = _Scope(self.stack[-1] if self.stack else None, is_class)
        self.scopes[id(node)] = scope
        return scope

    def _bind_local(self, name: str):
        self.stack[-1].locals.add(name)

    def visit_Module(self, node):
        self.stack.append(self._enter(node))
        self.generic_visit(node)
        self.stack.pop()

    def _function(self, node):
        for dec in getattr(node, "decorator_list", []):
            self.visit(dec)
        args = node.args
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        if isinstance(node, ast.Lambda):
            body = [node.body]
        else:
            self._bind_local(node.name)
            self.functions[(id(self.stack[-1]), node.name)] = node
            for a in args.posonlyargs + args.args + args.kwonlyargs:
                if a.annotation:
                    self.visit(a.annotation)
            body = node.body
        scope = self._enter(node)
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                scope.locals.add(a.arg)
        self.stack.append(scope)
        for stmt in body:
            self.visit(stmt)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node):
        for expr in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(expr)
        self._bind_local(node.name)
        self.functions[(id(self.stack[-1]), node.name)] = node
        self.stack.append(self._enter(node, is_class=True))
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()

    def _comprehension(self, node):
        self.visit(node.generators[0].iter)
        self.stack.append(self._enter(node))
        for i, gen in enumerate(node.generators):
            self.visit(gen.target)
            if i:
                self.visit(gen.iter)
            for cond in gen.ifs:
                self.visit(cond)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.stack.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node):
        for alias in node.names:
            if alias.asname:
                self.stack[-1].imports[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.stack[-1].imports.setdefault(root, root)

    def visit_ImportFrom(self, node):
        module = "." * (node.level or 0) + (node.module or "")
        for alias in node.names:
            if alias.name == "*":
                continue
            self.stack[-1].imports[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name

    def visit_Global(self, node):
        self.stack[-1].globals.update(node.names)

    visit_Nonlocal = visit_Global

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, (ast.Name, ast.Attribute)):
            scope, name = self.stack[-1], node.targets[0].id
            key = (id(scope), name)
            self.assigned[key] = self.assigned.get(key, 0) + 1
            scope.aliases[name] = node.value

    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._bind_local(node.id)

    def visit_arg(self, node):
        self._bind_local(node.arg)

    def visit_ExceptHandler(self, node):
        if node.name:
            self._bind_local(node.name)
        self.generic_visit(node)

    def finish(self):
        """An alias assigned more than once (or also bound otherwise) is just a local."""
        for scope in self.scopes.values():
            for name in list(scope.aliases):
                if self.assigned.get((id(scope), name), 0) > 1:
                    del scope.aliases[name]
        return self.scopes


class _Resolver:
    def __init__(self, scopes: dict[int, _Scope]):
        self.scopes = scopes

    def name(self, ident: str, scope: _Scope, depth: int = 0) -> str | None:
        if depth > 20:
            return None
        first = True
        s = scope
        if ident in s.globals:
            while s.parent is not None:
                s = s.parent
        while s is not None:
            if s.is_class and not first:
                s = s.parent
                continue
            if ident in s.imports:
                return s.imports[ident]
            if ident in s.aliases:
                return self.expr(s.aliases[ident], s, depth + 1)
            if ident in s.locals:
                return None
            s, first = s.parent, False
        return None

    def expr(self, node, scope: _Scope, depth: int = 0) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.name(node.id, scope, depth)
        if base is None:
            return None
        return ".".join([base] + parts[::-1])


# --------------------------------------------------------------------------- matching
def _render_joined(node: ast.JoinedStr) -> str:
    """f"cuda:{rank}" -> "cuda:0": enough to test it against a device pattern."""
    out = []
    for part in node.values:
        out.append(part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "0")
    return "".join(out)


_FORMAT_FIELD = re.compile(r"\{[^{}]*\}")
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-+ #0]*\d*(?:\.\d+)?[sdirfgxX]")
_COMPARE_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _string_parts(node) -> list:
    """(literal node, text it renders to) for each string literal an expression may evaluate to:
    through `a if c else b`, `a or b`, `d.get(k, 'cuda')`, f-strings, `'cuda:{}'.format(i)`,
    `'cuda:%d' % i` and `'cuda:' + str(i)` (a formatted field renders as ``0``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node, node.value)]
    if isinstance(node, ast.JoinedStr):
        return [(node, _render_joined(node))]
    if isinstance(node, ast.IfExp):
        return _string_parts(node.body) + _string_parts(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [p for v in node.values for p in _string_parts(v)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and (left := _const_str(node.left)) is not None:
        return [(node.left, _PERCENT_FIELD.sub("0", left))]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        right = _const_str(node.right)
        return [(lit, text + (right if right is not None else "0")) for lit, text in _string_parts(node.left)]
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format" and (fmt := _const_str(func.value)) is not None:
            return [(func.value, _FORMAT_FIELD.sub("0", fmt))]
        if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv") and len(node.args) == 2:
            return _string_parts(node.args[1])
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
            return _string_parts(node.args[2])
    return []


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _argparse_dest(call: ast.Call) -> str | None:
    """The attribute `parser.add_argument(...)` stores into (argparse's own naming)."""
    for kw in call.keywords:
        if kw.arg == "dest":
            return _const_str(kw.value)
    flags = [_const_str(a) for a in call.args]
    if not flags or any(f is None for f in flags):
        return None
    names = [f for f in flags if f is not None]   # all of them (checked above)
    chosen = next((f for f in names if f.startswith("--")), None) or names[0]
    return chosen.lstrip("-").replace("-", "_") or None


class _Flow(ast.NodeVisitor):
    """Where string literals and keyword dicts flow (a pass after binding; flow-insensitive).

    A *slot* is a place a value is stored and read back: a variable (per binding scope), an
    attribute name on any object (``args.device``, ``self.device``), a constant dict key
    (``cfg['device']``, ``{'device': ...}``, ``dict(device=...)``), an argparse option's dest
    and a local function's parameters and return value.  A literal lands in slots, directly in
    a *device sink* (an argument of a torch call or ``.to()``, a ``device=`` keyword: the
    `device_flow` section of the rules) or in a comparison.  A slot read by a sink makes the
    slots that flow into it sinks too.  Dicts that reach a call as ``**kwargs`` are followed
    the same way (through assignment, ``.update()`` and ``d[key] = value``).
    """

    def __init__(self, spec: FlowSpec, scopes: dict, functions: dict):
        self.spec = spec
        self.scopes = scopes
        self.functions = functions
        self.resolve = _Resolver(scopes)
        self.stack: list[_Scope] = []
        self.rendered: dict[int, str] = {}     # id(literal) -> text it renders to
        self.lands: dict[int, set] = {}        # id(literal) -> {("sink",), ("compare",), ("slot", slot)}
        self.sink_reads: set = set()
        self.edges: set = set()                # (dst slot, src slot): src's value flows into dst
        self.entries: dict = {}                # slot -> [(key, value node, node to report at)]
        self.has_dict: set = set()
        self.opaque: set = set()               # slots that also receive what is not a dict
        self.star: dict[int, tuple] = {}       # id(call) -> (entries, slots, complete) of its **kwargs
        self.compared: set = set()             # id() of compared expressions (x.device == torch.device(...))
        self.sinked: set = set()
        self.sources: dict = {}

    # -- scopes and slots -------------------------------------------------------------
    def _scoped(self, node):
        self.stack.append(self.scopes[id(node)])
        self.generic_visit(node)
        self.stack.pop()

    visit_Module = visit_ClassDef = visit_Lambda = _scoped
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scoped

    def _function(self, node):
        scope = self.scopes[id(node)]
        args = node.args
        positional = args.posonlyargs + args.args
        for a in positional + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                self.opaque.add(("n", id(scope), a.arg))
        for a, default in zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True):
            self._flow_into(default, [("n", id(scope), a.arg)])
        for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if default is not None:
                self._flow_into(default, [("n", id(scope), a.arg)])
        self._scoped(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _leaf(self, node):
        """Nothing below these nodes matters here (and skipping them keeps the pass cheap)."""

    visit_Name = visit_Constant = visit_Load = visit_Store = visit_Del = visit_Import = visit_ImportFrom = _leaf

    def _binding(self, ident: str):
        """The scope that binds ``ident`` here; None for an import; the module scope's parent
        (0) for a name bound nowhere (a builtin)."""
        s, first = self.stack[-1], True
        if ident in s.globals:
            while s.parent is not None:
                s = s.parent
        while s is not None:
            if s.is_class and not first:
                s = s.parent
                continue
            if ident in s.imports:
                return None
            if ident in s.locals or ident in s.aliases:
                return s
            s, first = s.parent, False
        return 0

    def _name_slot(self, ident: str):
        scope = self._binding(ident)
        return None if scope is None else ("n", id(scope) if scope else 0, ident)

    def _is_builtin(self, func, name: str) -> bool:
        return isinstance(func, ast.Name) and func.id == name and self._binding(name) == 0

    def _local_function(self, func):
        if not isinstance(func, ast.Name):
            return None
        scope = self._binding(func.id)
        return self.functions.get((id(scope), func.id)) if scope else None

    def _store_slots(self, target) -> list:
        if isinstance(target, ast.Name):
            slot = self._name_slot(target.id)
            out = [slot] if slot else []
            if self.stack[-1].is_class:
                out.append(("a", target.id))   # class attribute: read back as X.name
            return out
        if isinstance(target, ast.Attribute):
            return [("a", target.attr)]
        if isinstance(target, ast.Subscript) and (key := _const_str(target.slice)) is not None:
            return [("k", key)]
        return []

    def _read_slots(self, node) -> list:
        """The slots an expression reads its value (or part of it) from."""
        if isinstance(node, ast.Name):
            slot = self._name_slot(node.id)
            return [slot] if slot else []
        if isinstance(node, ast.Attribute):
            if self.resolve.expr(node, self.stack[-1]) is not None:
                return []  # a member of an imported module
            return [("a", node.attr)]
        if isinstance(node, ast.Subscript):
            key = _const_str(node.slice)
            return [("k", key)] if key is not None else []
        if isinstance(node, ast.IfExp):
            return self._read_slots(node.body) + self._read_slots(node.orelse)
        if isinstance(node, ast.BoolOp):
            return [s for v in node.values for s in self._read_slots(v)]
        if isinstance(node, ast.BinOp):
            return self._read_slots(node.left) + self._read_slots(node.right)
        if isinstance(node, ast.JoinedStr):
            return [s for v in node.values if isinstance(v, ast.FormattedValue) for s in self._read_slots(v.value)]
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "format":
                return self._read_slots(func.value) + [s for a in node.args for s in self._read_slots(a)]
            if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
                key = _const_str(node.args[0])
                return ([("k", key)] if key is not None else []) + \
                    [s for a in node.args[1:] for s in self._read_slots(a)]
            if self._is_builtin(func, "str") and node.args:
                return self._read_slots(node.args[0])
            if self._is_builtin(func, "getattr") and len(node.args) >= 2 \
                    and (attr := _const_str(node.args[1])) is not None:
                return [("a", attr)] + [s for a in node.args[2:] for s in self._read_slots(a)]
            fn = self._local_function(func)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return [("r", id(self.scopes[id(fn)]))]
        return []

    def _dicts(self, node):
        """(dict displays / dict() calls an expression may be, whether it is only those)."""
        if isinstance(node, ast.Dict) or (isinstance(node, ast.Call) and self._is_builtin(node.func, "dict")):
            return [node], True
        if isinstance(node, ast.IfExp):
            a, a_only = self._dicts(node.body)
            b, b_only = self._dicts(node.orelse)
            return a + b, a_only and b_only
        return [], False

    def _dict_entries(self, node):
        """(entries, slots merged in) of a dict display or dict() call."""
        entries, slots = [], []
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:                      # {**base, ...}
                    slots += self._read_slots(v)
                elif (key := _const_str(k)) is not None:
                    entries.append((key, v, k))
            return entries, slots
        for a in node.args[:1]:
            inner, only = self._dicts(a)
            for d in inner:
                e, s = self._dict_entries(d)
                entries, slots = entries + e, slots + s
            if not inner:
                slots += self._read_slots(a)
        for kw in node.keywords:
            if kw.arg is None:
                slots += self._read_slots(kw.value)
            else:
                entries.append((kw.arg, kw.value, kw))
        return entries, slots

    # -- recording ----------------------------------------------------------------------
    def _land(self, expr, where: tuple):
        for lit, text in _string_parts(expr):
            self.rendered[id(lit)] = text
            self.lands.setdefault(id(lit), set()).add(where)

    def _flow_into(self, expr, dsts: list):
        if not dsts:
            return
        for dst in dsts:
            self._land(expr, ("slot", dst))
        srcs = self._read_slots(expr)
        dicts, only_dicts = self._dicts(expr)
        for dst in dsts:
            self.edges.update((dst, src) for src in srcs)
            for d in dicts:
                entries, merged = self._dict_entries(d)
                self.has_dict.add(dst)
                self.entries.setdefault(dst, []).extend(entries)
                self.edges.update((dst, src) for src in merged)
            if not srcs and not only_dicts:
                self.opaque.add(dst)

    def _sink(self, expr):
        for e in expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]:   # devices=['cuda:0', ...]
            self._land(e, ("sink",))
            self.sink_reads.update(self._read_slots(e))

    def _compare(self, expr):
        for e in expr.elts if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) else [expr]:
            self.compared.add(id(e))
            self._land(e, ("compare",))

    # -- visitors -----------------------------------------------------------------------
    def _assign(self, target, value):
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
                    and not any(isinstance(e, ast.Starred) for e in target.elts + value.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._assign(t, v)
            else:
                for t in target.elts:
                    self.opaque.update(self._store_slots(t.value if isinstance(t, ast.Starred) else t))
            return
        if isinstance(target, ast.Subscript) and (key := _const_str(target.slice)) is not None:
            for slot in self._read_slots(target.value):
                self.entries.setdefault(slot, []).append((key, value, target))
        self._flow_into(value, self._store_slots(target))

    def visit_Assign(self, node):
        for target in node.targets:
            self._assign(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._assign(node.target, node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node):
        self._assign(node.target, node.value)
        self.generic_visit(node)

    def _opaque_target(self, node):
        for t in ast.walk(node):
            if isinstance(t, (ast.Name, ast.Attribute, ast.Subscript)):
                self.opaque.update(self._store_slots(t))

    def visit_For(self, node):
        self._opaque_target(node.target)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_withitem(self, node):
        if node.optional_vars is not None:
            self._opaque_target(node.optional_vars)
        self.generic_visit(node)

    def visit_Return(self, node):
        if node.value is not None and len(self.stack) > 1:
            self._flow_into(node.value, [("r", id(self.stack[-1]))])
        self.generic_visit(node)

    def visit_Compare(self, node):
        if any(isinstance(op, _COMPARE_OPS) for op in node.ops):
            for operand in [node.left] + node.comparators:
                self._compare(operand)
        self.generic_visit(node)

    def visit_MatchValue(self, node):   # match device: case 'cuda': ...
        self._compare(node.value)
        self.generic_visit(node)

    def visit_Dict(self, node):
        for k, v in zip(node.keys, node.values, strict=True):
            if _const_str(k) is not None:
                self._flow_into(v, [("k", k.value)])
        self.generic_visit(node)

    # above complexity 15: one branch per call pattern the static scan recognises (static_scan split: issue 21)
    def visit_Call(self, node):  # noqa: C901
        func = node.func
        qual = self.resolve.expr(func, self.stack[-1]) if isinstance(func, (ast.Name, ast.Attribute)) else None
        method = func.attr if isinstance(func, ast.Attribute) and qual is None else None
        every = (qual is not None and self.spec.is_sink_call(qual)) or method in self.spec.methods
        # a device built only to be compared with (x.device == torch.device('cuda')) is a comparison
        read = self._compare if id(node) in self.compared else self._sink
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                continue
            if every:
                read(arg)
            if method in self.spec.compare_methods:
                self._compare(arg)
        for kw in node.keywords:
            if kw.arg is not None and (every or kw.arg in self.spec.kwargs):
                read(kw.value)
        if method == "add_argument":   # default= and choices= are what args.<dest> may hold
            dest = _argparse_dest(node)
            for kw in node.keywords if dest else ():
                if kw.arg == "default":
                    self._flow_into(kw.value, [("a", dest)])
                elif kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple, ast.Set)):
                    for choice in kw.value.elts:
                        self._flow_into(choice, [("a", dest)])
        elif method == "update" and isinstance(func.value, (ast.Name, ast.Attribute, ast.Subscript)):
            targets = self._read_slots(func.value)
            for arg in node.args:
                self._flow_into(arg, targets)
            for kw in node.keywords:
                if kw.arg is None:
                    self._flow_into(kw.value, targets)
                else:
                    for slot in targets:
                        self.entries.setdefault(slot, []).append((kw.arg, kw.value, kw))
        elif self._is_builtin(func, "dict"):
            for kw in node.keywords:
                if kw.arg is not None:
                    self._flow_into(kw.value, [("k", kw.arg)])
        else:
            fn, skip = self._local_function(func), 0
            if isinstance(fn, ast.ClassDef):   # Net(device) -> Net.__init__(self, device)
                fn, skip = next((f for f in fn.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None), 1
            if fn is not None:
                scope = id(self.scopes[id(fn)])
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args][skip:]
                for name, arg in zip(params, node.args, strict=False):
                    if isinstance(arg, ast.Starred):
                        break
                    self._flow_into(arg, [("n", scope, name)])
                names = set(params) | {a.arg for a in fn.args.kwonlyargs}
                for kw in node.keywords:
                    if kw.arg in names:
                        self._flow_into(kw.value, [("n", scope, kw.arg)])
        stars = [kw.value for kw in node.keywords if kw.arg is None]
        if stars:
            entries: list = []
            slots: list = []
            complete = True
            for expr in stars:
                dicts, only = self._dicts(expr)
                for d in dicts:
                    e, s = self._dict_entries(d)
                    entries, slots = entries + e, slots + s
                reads = [] if dicts else self._read_slots(expr)
                slots += reads
                complete = complete and (only or bool(reads))
            self.star[id(node)] = (entries, slots, complete)
        self.generic_visit(node)

    # -- results ------------------------------------------------------------------------
    def finish(self) -> _Flow:
        for dst, src in self.edges:
            self.sources.setdefault(dst, set()).add(src)
        sinked, todo = set(self.sink_reads), list(self.sink_reads)
        while todo:
            for src in self.sources.get(todo.pop(), ()):
                if src not in sinked:
                    sinked.add(src)
                    todo.append(src)
        self.sinked = sinked
        return self

    def _device_slot(self, slot) -> bool:
        return slot in self.sinked or (slot[0] != "r" and self.spec.is_device_name(slot[-1]))

    def contexts(self, node) -> set:
        """How a string literal is used: {'device', 'compare'} or a subset."""
        out = set()
        for where in self.lands.get(id(node), ()):
            if where[0] == "sink" or (where[0] == "slot" and self._device_slot(where[1])):
                out.add("device")
            elif where[0] == "compare":
                out.add("compare")
        return out

    def text(self, node) -> str | None:
        return self.rendered.get(id(node))

    def star_kwargs(self, call: ast.Call):
        """(entries, complete) of the dicts passed to ``call`` as ``**kwargs``; complete is
        False when some of what is passed cannot be followed (a parameter, a call result)."""
        if id(call) not in self.star:
            return [], True
        entries, slots, complete = self.star[id(call)]
        entries = list(entries)
        seen: set = set()
        todo = list(slots)
        while todo:
            slot = todo.pop()
            if slot in seen:
                continue
            seen.add(slot)
            entries += self.entries.get(slot, [])
            srcs = self.sources.get(slot, ())
            if slot in self.opaque or not (slot in self.has_dict or srcs):
                complete = False
            todo.extend(srcs)
        return entries, complete


class _Finder(ast.NodeVisitor):
    """Second pass: apply the rules to every call, reference, string and import."""

    def __init__(self, rules: RuleSet, scopes: dict[int, _Scope], lines: list[bytes], flow):
        self.rules = rules
        self._flow: _Flow | None = None   # built on first use: most files never need it
        self._make_flow = flow
        self.resolve = _Resolver(scopes)
        self.scopes = scopes
        self.lines = lines
        self.stack: list[_Scope] = []
        self.hits: list[Hit] = []
        self.consumed: set[int] = set()
        self.seen_chains: set[int] = set()
        self.method_rules = [r for r in rules.rules if r.methods]
        self.attribute_rules = [r for r in rules.rules if r.attributes]
        self.string_rules = [r for r in rules.rules if r.strings]
        self.import_rules = [r for r in rules.rules if r.imports]

    @property
    def flow(self) -> _Flow:
        if self._flow is None:
            self._flow = self._make_flow()
        return self._flow

    # -- positions ------------------------------------------------------------------
    def _col(self, line: int, byte_col: int) -> int:
        raw = self.lines[line - 1] if 0 < line <= len(self.lines) else b""
        return len(raw[:byte_col].decode("utf-8", "replace")) + 1

    def _segment(self, node) -> str | None:
        if node.lineno != node.end_lineno:
            return None
        return self.lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode("utf-8", "replace")

    def _edit(self, node, old: str, new: str) -> Edit | None:
        seg = self._segment(node)
        if seg is None or old not in seg:
            return None
        return Edit(node.lineno, node.col_offset, node.end_col_offset, seg, seg.replace(old, new, 1))

    def _literal_edits(self, nodes, kind: str) -> list:
        old, new = ("nccl", "hccl") if kind == "nccl" else ("cuda", "npu")
        return [e for e in (self._edit(n, old, new) for n in nodes) if e]

    # -- scopes ---------------------------------------------------------------------
    def _scoped(self, node):
        self.stack.append(self.scopes[id(node)])
        self.generic_visit(node)
        self.stack.pop()

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _scoped
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scoped

    def _resolve(self, node) -> str | None:
        return self.resolve.expr(node, self.stack[-1])

    def _qual_rules(self, qualname: str) -> list:
        return self.rules.name_rules(qualname)

    # -- where tests ----------------------------------------------------------------
    def _candidates(self, call: ast.Call, where: dict):
        """The values the argument a `where` test reads may have, each with the node to report
        at (None: the call), and whether that is all of them (False when the call passes a
        ``**kwargs`` dict that cannot be followed).  An argument given explicitly wins; else the
        keyword is looked up in the dicts passed as ``**kwargs``."""
        if where.get("kwarg"):
            for kw in call.keywords:
                if kw.arg == where["kwarg"]:
                    return [(kw.value, None)], True
        idx = where.get("arg")
        if idx is not None and len(call.args) > idx and not any(isinstance(a, ast.Starred) for a in call.args[:idx + 1]):
            return [(call.args[idx], None)], True
        if not where.get("kwarg") or not any(kw.arg is None for kw in call.keywords):
            return [], True
        entries, complete = self.flow.star_kwargs(call)
        return [(value, at) for key, value, at in entries if key == where["kwarg"]], complete

    def _test(self, call: ast.Call, where: dict):
        """(passed, literal nodes that made it pass, node to report at: None for the call)."""
        candidates, complete = self._candidates(call, where)
        test = where.get("is")
        if test == "not-true":
            literally_true = any(isinstance(v, ast.Constant) and v.value is True for v, _ in candidates)
            return complete and not literally_true, [], None
        for value, at in candidates:
            if test == "truthy":
                if not (isinstance(value, ast.Constant) and not value.value):
                    return True, [], at
                continue
            if test == "cuda" and isinstance(value, ast.Call) and self._resolve(value.func) == "torch.device":
                value = value.args[0] if value.args else None
            if test == "cuda":
                nodes = [n for n, text in _string_parts(value) if DEVICE_RX.fullmatch(text)]
            elif test == "nccl":
                nodes = [n for n, text in _string_parts(value) if "nccl" in text]
            else:
                nodes = []
            if nodes:
                return True, nodes, at
        return False, [], None

    # -- emit -----------------------------------------------------------------------
    def _hit(self, rule: Rule, node, line: int, byte_col: int, api: str, *, name: str = "", value: str = "",
             edits=(), unsafe: str | None = None):
        fill = dict(name=name or api, tail=rule.tail_of(name) if name else "", value=value,
                    npu_value=value.replace("cuda", "npu", 1), kernels="")
        replacement = rule.render(rule.replacement, **fill)
        message = rule.render(rule.message, **fill)
        edits = [e for e in edits if e]
        if edits:
            unsafe = None
        elif unsafe is None:
            unsafe = (rule.judgement or f"needs judgement: {message}") if rule.rewrite is None \
                else "the expression spans several lines; edit it by hand"
        self.hits.append(Hit(rule=rule, line=line, column=self._col(line, byte_col), api=api,
                             message=message, replacement=replacement,
                             edits=edits, unsafe_reason=unsafe))

    def _npu_name_edit(self, rule: Rule, chain, qualname: str):
        if rule.rewrite != "npu-name" or not qualname.startswith("torch.cuda."):
            return None, "needs judgement: no mechanical rewrite for this rule"
        member = qualname[len("torch.cuda."):]
        if member not in self.rules.safe_npu_members:
            return None, f"torch_npu.npu.{member} is not in the list of confirmed torch_npu equivalents"
        seg = self._segment(chain)
        if seg is None:
            return None, "the expression spans several lines"
        return Edit(chain.lineno, chain.col_offset, chain.end_col_offset, seg, f"torch_npu.npu.{member}"), None

    def _compared(self, call: ast.Call) -> bool:
        """Is the call compared with (``==``, ``in``...)?  Only asks the flow pass when the call
        has a string argument that could name a device."""
        if not any(self.rules.flow_tokens.search(text) for a in call.args + [k.value for k in call.keywords]
                   for _, text in _string_parts(a)):
            return False
        return id(call) in self.flow.compared

    def _rename_edit(self, rule: Rule, chain):
        """`rewrite: rename`: the reference's last name becomes `rewrite_to` (dist.X -> dist.Y)."""
        if not isinstance(chain, ast.Attribute) or not rule.rewrite_to:
            return None, "imported by its own name: change the import and the uses together"
        assert chain.end_lineno is not None and chain.end_col_offset is not None   # parsed nodes have positions
        start = chain.end_col_offset - len(chain.attr.encode())
        return Edit(chain.end_lineno, start, chain.end_col_offset, chain.attr, rule.rewrite_to), None

    def _report_name(self, node, chain, qualname: str, call: ast.Call | None):
        """Apply `names` rules to a resolved reference (``call`` set when it is called)."""
        done: set[str] = set()
        for rule in self._qual_rules(qualname):
            if rule.id in done:
                continue
            literal_nodes, at = [], None
            if rule.where:
                if call is None or (rule.where.get("is") == "cuda" and self._compared(call)):
                    continue   # compared, not used: the string rules judge its literal
                ok, literal_nodes, at = self._test(call, rule.where)
                if not ok:
                    continue
            line, col = (at.lineno, at.col_offset) if at is not None else self._position(node, chain)
            edits, unsafe = [], None
            if literal_nodes:
                self.consumed.update(id(n) for n in literal_nodes)
                edits = self._literal_edits(literal_nodes, rule.where["is"])
            elif rule.rewrite == "npu-name":
                edit, unsafe = self._npu_name_edit(rule, chain, qualname)
                edits = [edit] if edit else []
            elif rule.rewrite == "rename":
                edit, unsafe = self._rename_edit(rule, chain)
                edits = [edit] if edit else []
            api = qualname + ("()" if call is not None else "") if at is None \
                else f"{qualname}(**kwargs) on line {self._position(node, chain)[0]}"
            self._hit(rule, node, line, col, api, name=qualname, edits=edits, unsafe=unsafe)
            done.add(rule.id)
            if not rule.where:
                break
        return bool(done)

    def _position(self, node, chain):
        """The line Python reports for a call: the attribute's line for method calls."""
        if isinstance(chain, ast.Attribute) and chain.end_lineno != chain.lineno:
            line = chain.end_lineno
            assert chain.end_col_offset is not None   # parsed nodes have positions
            return line, chain.end_col_offset - len(chain.attr.encode())
        return node.lineno, node.col_offset

    # -- visitors -------------------------------------------------------------------
    def visit_Call(self, node: ast.Call):
        func = node.func
        if isinstance(func, (ast.Name, ast.Attribute)):
            qualname = self._resolve(func)
            if qualname is not None:
                self._report_name(node, func, qualname, node)
                self._skip_chain(func)
            elif isinstance(func, ast.Attribute):
                self._report_method(node, func)
        self.generic_visit(node)

    def _skip_chain(self, chain):
        while isinstance(chain, ast.Attribute):
            self.seen_chains.add(id(chain))
            chain = chain.value
        self.seen_chains.add(id(chain))

    def _report_method(self, call: ast.Call, func: ast.Attribute):
        done: set[str] = set()
        for rule in self.method_rules:
            if func.attr not in rule.methods or rule.id in done:
                continue
            literal_nodes, at = [], None
            if rule.where:
                ok, literal_nodes, at = self._test(call, rule.where)
                if not ok:
                    continue
            line, col = (at.lineno, at.col_offset) if at is not None else self._position(call, func)
            if literal_nodes:
                self.consumed.update(id(n) for n in literal_nodes)
                edits = self._literal_edits(literal_nodes, rule.where["is"])
            elif rule.rewrite == "method-npu":
                assert func.end_lineno is not None and func.end_col_offset is not None
                start = func.end_col_offset - len(func.attr.encode())
                edits = [Edit(func.end_lineno, start, func.end_col_offset, func.attr, "npu")]
            else:
                edits = []
            api = f".{func.attr}()" if at is None else f".{func.attr}(**kwargs) on line {self._position(call, func)[0]}"
            self._hit(rule, call, line, col, api, edits=edits)
            done.add(rule.id)
            if not rule.where:
                break

    def visit_Attribute(self, node: ast.Attribute):
        if id(node) in self.seen_chains:
            return
        qualname = self._resolve(node)
        if qualname is None:
            for rule in self.attribute_rules:
                if node.attr in rule.attributes:
                    line, col = self._position(node, node)
                    self._hit(rule, node, line, col, f".{node.attr}")
                    break
            self.generic_visit(node)
            return
        self._skip_chain(node)
        self._report_name(node, node, qualname, None)

    def visit_Name(self, node: ast.Name):
        """A bare imported name that is not called (``if amp is not None``) is not a use:
        its import line and its calls are reported instead."""

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str) and id(node) not in self.consumed:
            self._report_string(node, node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr):
        if id(node) not in self.consumed:
            if self._report_string(node, _render_joined(node)):
                return
        self.generic_visit(node)

    def _report_string(self, node, text: str) -> bool:
        """String rules; one with `flows` only where the literal flows there (see _Flow)."""
        value = text
        rendered = self.flow.text(node) or text if self.rules.flow_tokens.search(text) else text
        if len(rendered) > 64:
            return False
        contexts = None
        for rule in self.string_rules:
            if rule.matches_string(rendered if rule.flows else value):
                if rule.flows:
                    contexts = self.flow.contexts(node) if contexts is None else contexts
                    if not contexts.intersection(rule.flows):
                        continue
                kind = "nccl" if rule.rewrite == "hccl-string" else "cuda"
                edits = self._literal_edits([node], kind) if rule.rewrite in ("hccl-string", "device-string") else []
                self._hit(rule, node, node.lineno, node.col_offset, repr(value), value=value, edits=edits)
                return True
        return False

    def _report_import(self, node, modules: list[str]):
        for module in modules:
            for rule in self.import_rules:
                if rule.matches_import(module):
                    self._hit(rule, node, node.lineno, node.col_offset, f"import {module}", value=module)
                    return

    def visit_Import(self, node):
        self._report_import(node, [a.name for a in node.names])

    def visit_ImportFrom(self, node):
        if not node.level and node.module:
            self._report_import(node, [node.module])


# --------------------------------------------------------------------------- entry points
def scan_source(source: bytes | str, path: str = "<string>", rules: RuleSet | None = None) -> list[Hit]:
    """Hits for one Python source (raises SyntaxError/ValueError when it does not parse)."""
    rules = rules or load_rules()
    data = _as_utf8(source)
    tree = ast.parse(data, filename=path)
    binder = _Binder()
    binder.visit(tree)
    scopes = binder.finish()

    def make_flow():
        flow = _Flow(rules.flow, scopes, binder.functions)
        flow.visit(tree)
        return flow.finish()
    finder = _Finder(rules, scopes, data.splitlines(), make_flow)
    finder.visit(tree)
    hits = _apply_context(finder.hits)
    unique: dict[tuple, Hit] = {}
    for hit in hits:
        unique.setdefault((hit.rule.id, hit.line, hit.column), hit)
    return sorted(unique.values(), key=lambda h: (h.line, h.column, h.rule.id))


def _as_utf8(source: bytes | str) -> bytes:
    """UTF-8 bytes without a BOM: the AST's column offsets count UTF-8 bytes of the decoded text."""
    if isinstance(source, bytes):
        if source.startswith(b"\xef\xbb\xbf"):
            return source[3:]
        head = source[:400]
        if b"coding" in head:
            import io
            import tokenize
            encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
            if encoding not in ("utf-8", "utf-8-sig"):
                return source.decode(encoding).encode("utf-8")
        return source
    return source.lstrip("\ufeff").encode("utf-8")


def _apply_context(hits: list[Hit]) -> list[Hit]:
    """Drop `context: ported-file` advice in files with no other CUDA finding."""
    if any(h.rule.context != "ported-file" for h in hits):
        return hits
    return []


_CPP_BLOCK = re.compile(r"\b(TORCH_LIBRARY(?:_FRAGMENT)?|PYBIND11_MODULE)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{")
_GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>]+\s+)*?(\w+)\s*\(")


def scan_cpp(text: str, path: str, rules: RuleSet | None = None) -> list[Hit]:
    """CUDA kernels (.cu) and ops registered with TORCH_LIBRARY / PYBIND11_MODULE."""
    rules = rules or load_rules()
    hits: list[Hit] = []
    name = os.path.basename(path)
    for rule in rules.rules:
        if rule.files and any(Path(name).match(p) for p in rule.files):
            kernels = sorted(set(_GLOBAL_KERNEL.findall(text)))
            listed = f" (kernels: {', '.join(kernels[:12])}{', ...' if len(kernels) > 12 else ''})" if kernels else ""
            hits.append(Hit(rule=rule, line=1, column=1, api=name, message=rule.render(rule.message, kernels=listed),
                            replacement=rule.replacement, unsafe_reason="a CUDA kernel needs an NPU implementation"))
            break
    op_rule = next((r for r in rules.rules if r.cpp), None)
    if op_rule is None:
        return hits
    for block in _CPP_BLOCK.finditer(text):
        macro, namespace, var = block.groups()
        body = _brace_body(text, block.end() - 1)
        for op in re.finditer(rf"\b{re.escape(var)}\s*\.\s*(?:def|impl)\s*\(\s*(?:TORCH_SELECTIVE_SCHEMA\s*\(\s*)?\"([^\"(]+)",
                              body):
            qual = f"{namespace}::{op.group(1).strip()}" if macro.startswith("TORCH_LIBRARY") else \
                f"{namespace}.{op.group(1).strip()}"
            offset = block.end() + op.start()
            line = text.count("\n", 0, offset) + 1
            col = offset - (text.rfind("\n", 0, offset) + 1) + 1
            hits.append(Hit(rule=op_rule, line=line, column=col, api=qual,
                            message=op_rule.render(op_rule.message, value=qual),
                            replacement=op_rule.replacement, unsafe_reason="a custom op needs an NPU kernel"))
    return hits


def _brace_body(text: str, open_at: int) -> str:
    depth = 0
    for i in range(open_at, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
    return text[open_at + 1:]


def iter_source_files(paths, contained: bool = False) -> list[Path]:
    """Python and C/C++/CUDA files under ``paths`` (files or folders), skipping venvs and VCS dirs.

    Links to folders are never walked (no loops).  With ``contained``, a file inside a folder
    whose symbolic link leads out of it is left out (a project's link to ``/etc`` or a home
    folder is not the project), and so is anything but a regular file (a FIFO named ``x.py``
    would block forever); ``migrate`` lists them itself to say why it did not follow them.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.append(path)
            continue
        root = path.resolve()
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
            for fname in sorted(filenames):
                if fname.endswith(PY_SUFFIXES) or fname.endswith(CPP_SUFFIXES):
                    candidate = Path(dirpath) / fname
                    if not contained or _inside_regular_file(candidate, root):
                        found.append(candidate)
    return found


def _inside_regular_file(path: Path, root: Path) -> bool:
    try:
        real = path.resolve(strict=True)
        return real.is_relative_to(root) and stat.S_ISREG(real.stat().st_mode)
    except (OSError, RuntimeError):   # dangling link, loop
        return False


def scan_file(path: Path, rules: RuleSet | None = None) -> list[Finding]:
    """Findings for one file; a file that does not parse gives one `parse-error` finding."""
    rules = rules or load_rules()
    path = Path(path)
    display = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [_problem(display, None, f"could not read the file ({exc.strerror}); it was not scanned")]
    if path.suffix in CPP_SUFFIXES:
        text = data.decode("utf-8", "replace")
        if path.suffix not in (".cu", ".cuh") and "TORCH_LIBRARY" not in text and "PYBIND11_MODULE" not in text:
            return []
        lines = text.splitlines()
        return [h.to_finding(display, lines) for h in scan_cpp(text, display, rules)]
    if not rules.keywords.search(data.decode("latin-1")):
        return []  # no rule can match: skip the parse (keeps a 500-file project in seconds)
    try:
        hits = scan_source(data, display, rules)
    except (SyntaxError, ValueError, LookupError) as exc:  # LookupError: unknown coding cookie
        line = getattr(exc, "lineno", None)
        msg = getattr(exc, "msg", None) or str(exc)
        return [_problem(display, line, f"could not parse ({msg}); this file was not scanned")]
    try:
        lines = _as_utf8(data).decode("utf-8", "replace").splitlines()
    except (LookupError, UnicodeDecodeError):
        lines = data.decode("utf-8", "replace").splitlines()
    return [h.to_finding(display, lines) for h in hits]


def _problem(file: str, line: int | None, message: str) -> Finding:
    return Finding(rule="parse-error", file=file, line=line, column=None, api="(file)", message=message,
                   replacement="fix the syntax (Python 3) so the file can be checked", severity="warning",
                   origin="static")


PARALLEL_MIN_FILES = 200   # below this, starting worker processes costs more than it saves


def scan_paths(paths, rules: RuleSet | None = None, jobs: int | None = None, progress=None) -> list[Finding]:
    """Static findings for files and/or project folders, in file then line order.

    ``file`` is each path as given (or joined onto the given folder), so relative
    arguments give paths relative to the current directory.  Big trees are parsed in
    ``jobs`` worker processes (default: one per CPU).  ``progress(done, total)`` is
    called as files are scanned.
    """
    rules = rules or load_rules()
    files, seen = [], set()
    for path in iter_source_files(paths, contained=True):
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            files.append(path)
    jobs = jobs or os.cpu_count() or 1
    if progress is not None:
        progress(0, len(files))
    if jobs > 1 and len(files) >= PARALLEL_MIN_FILES and rules is load_rules():
        results = _scan_parallel(files, jobs, progress)
        if results is not None:
            return [f for chunk in results for f in chunk]
    findings: list[Finding] = []
    for i, path in enumerate(files, 1):
        findings.extend(scan_file(path, rules))
        if progress is not None:
            progress(i, len(files))
    return findings


def _scan_chunk(paths: list) -> list:
    rules = load_rules()
    return [scan_file(p, rules) for p in paths]


def _scan_parallel(files: list[Path], jobs: int, progress=None):
    """Scan in worker processes (fork where available: no re-import); None if they cannot start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    try:
        context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
            else multiprocessing.get_context()
        size = max(8, len(files) // (jobs * 8))
        chunks = [files[i:i + size] for i in range(0, len(files), size)]
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            results, done = [], 0
            for chunk, found in zip(chunks, pool.map(_scan_chunk, chunks), strict=True):
                results.extend(found)
                done += len(chunk)
                if progress is not None:
                    progress(done, len(files))
            return results
    except (OSError, RuntimeError, ImportError):  # no process support (sandbox): scan in-process
        return None
