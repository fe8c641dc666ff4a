"""The static scan's rule pass: each rule applied to a parsed file, each match rendered as a ``Hit``.

A ``Hit`` carries the finding (message and replacement rendered from the rule's templates)
and the exact edits a safe mechanical rewrite makes; ``opscope.analysis.static.migrate`` applies them.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from opscope.analysis.static.flow import Flow, render_joined, string_parts
from opscope.analysis.static.rules import Rule, RuleSet
from opscope.analysis.static.scopes import Resolver, Scope, ScopedVisitor
from opscope.model import Finding

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


class Finder(ScopedVisitor):
    """Second pass: apply the rules to every call, reference, string and import."""

    def __init__(self, rules: RuleSet, scopes: dict[int, Scope], lines: list[bytes], flow):
        super().__init__(scopes)
        self.rules = rules
        self._flow: Flow | None = None   # built on first use: most files never need it
        self._make_flow = flow
        self.resolve = Resolver(scopes)
        self.lines = lines
        self.hits: list[Hit] = []
        self.consumed: set[int] = set()
        self.seen_chains: set[int] = set()
        self.method_rules = [r for r in rules.rules if r.methods]
        self.attribute_rules = [r for r in rules.rules if r.attributes]
        self.string_rules = [r for r in rules.rules if r.strings]
        self.import_rules = [r for r in rules.rules if r.imports]

    @property
    def flow(self) -> Flow:
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
                nodes = [n for n, text in string_parts(value) if DEVICE_RX.fullmatch(text)]
            elif test == "nccl":
                nodes = [n for n, text in string_parts(value) if "nccl" in text]
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
                   for _, text in string_parts(a)):
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
            if self._report_string(node, render_joined(node)):
                return
        self.generic_visit(node)

    def _report_string(self, node, text: str) -> bool:
        """String rules; one with `flows` only where the literal flows there (see Flow)."""
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
