"""Where string literals and keyword dicts flow in a parsed file (the static scan's flow pass).

Whether a ``'cuda'`` string names a device is decided by where it flows: into a torch call,
``.to()``, a ``device=`` keyword, or a variable / attribute / dict key / argparse option read
so (what reads a device is the `device_flow` section of the rules file).  A TVM target or a log
message is then no finding, and a comparison is only advice.
"""
from __future__ import annotations

import ast
import re

from opscope.analysis.static.rules import FlowSpec
from opscope.analysis.static.scopes import Resolver, ScopedVisitor


def render_joined(node: ast.JoinedStr) -> str:
    """f"cuda:{rank}" -> "cuda:0": enough to test it against a device pattern."""
    out = []
    for part in node.values:
        out.append(part.value if isinstance(part, ast.Constant) and isinstance(part.value, str) else "0")
    return "".join(out)


_FORMAT_FIELD = re.compile(r"\{[^{}]*\}")
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-+ #0]*\d*(?:\.\d+)?[sdirfgxX]")
_COMPARE_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def string_parts(node) -> list:
    """(literal node, text it renders to) for each string literal an expression may evaluate to:
    through `a if c else b`, `a or b`, `d.get(k, 'cuda')`, f-strings, `'cuda:{}'.format(i)`,
    `'cuda:%d' % i` and `'cuda:' + str(i)` (a formatted field renders as ``0``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node, node.value)]
    if isinstance(node, ast.JoinedStr):
        return [(node, render_joined(node))]
    if isinstance(node, ast.IfExp):
        return string_parts(node.body) + string_parts(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [p for v in node.values for p in string_parts(v)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and (left := const_str(node.left)) is not None:
        return [(node.left, _PERCENT_FIELD.sub("0", left))]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        right = const_str(node.right)
        return [(lit, text + (right if right is not None else "0")) for lit, text in string_parts(node.left)]
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format" and (fmt := const_str(func.value)) is not None:
            return [(func.value, _FORMAT_FIELD.sub("0", fmt))]
        if isinstance(func, ast.Attribute) and func.attr in ("get", "getenv") and len(node.args) == 2:
            return string_parts(node.args[1])
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
            return string_parts(node.args[2])
    return []


def const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _argparse_dest(call: ast.Call) -> str | None:
    """The attribute `parser.add_argument(...)` stores into (argparse's own naming)."""
    for kw in call.keywords:
        if kw.arg == "dest":
            return const_str(kw.value)
    flags = [const_str(a) for a in call.args]
    if not flags or any(f is None for f in flags):
        return None
    names = [f for f in flags if f is not None]   # all of them (checked above)
    chosen = next((f for f in names if f.startswith("--")), None) or names[0]
    return chosen.lstrip("-").replace("-", "_") or None


class Flow(ScopedVisitor):
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
        super().__init__(scopes)
        self.spec = spec
        self.functions = functions
        self.resolve = Resolver(scopes)
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
        s = self.stack[-1].binding(ident)
        if s is None:
            return 0
        return None if ident in s.imports else s

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
        if isinstance(target, ast.Subscript) and (key := const_str(target.slice)) is not None:
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
            key = const_str(node.slice)
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
                key = const_str(node.args[0])
                return ([("k", key)] if key is not None else []) + \
                    [s for a in node.args[1:] for s in self._read_slots(a)]
            if self._is_builtin(func, "str") and node.args:
                return self._read_slots(node.args[0])
            if self._is_builtin(func, "getattr") and len(node.args) >= 2 \
                    and (attr := const_str(node.args[1])) is not None:
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
                elif (key := const_str(k)) is not None:
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
        for lit, text in string_parts(expr):
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
        if isinstance(target, ast.Subscript) and (key := const_str(target.slice)) is not None:
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
            if const_str(k) is not None:
                self._flow_into(v, [("k", k.value)])
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        qual = self.resolve.expr(func, self.stack[-1]) if isinstance(func, (ast.Name, ast.Attribute)) else None
        method = func.attr if isinstance(func, ast.Attribute) and qual is None else None
        self._call_arguments(node, qual, method)
        if method == "add_argument":
            self._add_argument(node)
        elif method == "update" and isinstance(func.value, (ast.Name, ast.Attribute, ast.Subscript)):
            self._update(node, func.value)
        elif self._is_builtin(func, "dict"):
            for kw in node.keywords:
                if kw.arg is not None:
                    self._flow_into(kw.value, [("k", kw.arg)])
        else:
            self._local_call(node)
        self._star_kwargs(node)
        self.generic_visit(node)

    def _call_arguments(self, node, qual: str | None, method: str | None):
        """The arguments a sink call reads as a device, or a compare method compares."""
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

    def _add_argument(self, node):
        """default= and choices= of ``parser.add_argument`` are what args.<dest> may hold."""
        dest = _argparse_dest(node)
        for kw in node.keywords if dest else ():
            if kw.arg == "default":
                self._flow_into(kw.value, [("a", dest)])
            elif kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple, ast.Set)):
                for choice in kw.value.elts:
                    self._flow_into(choice, [("a", dest)])

    def _update(self, node, target):
        """``d.update(other, key=value)`` flows into what ``d`` is read from."""
        targets = self._read_slots(target)
        for arg in node.args:
            self._flow_into(arg, targets)
        for kw in node.keywords:
            if kw.arg is None:
                self._flow_into(kw.value, targets)
            else:
                for slot in targets:
                    self.entries.setdefault(slot, []).append((kw.arg, kw.value, kw))

    def _local_call(self, node):
        """A call of a function (or class) of this file: its arguments flow into its parameters."""
        fn, skip = self._local_function(node.func), 0
        if isinstance(fn, ast.ClassDef):   # Net(device) -> Net.__init__(self, device)
            fn, skip = next((f for f in fn.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None), 1
        if fn is None:
            return
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

    def _star_kwargs(self, node):
        """Record the dicts a call receives as ``**kwargs`` (read back by ``star_kwargs``)."""
        stars = [kw.value for kw in node.keywords if kw.arg is None]
        if not stars:
            return
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

    # -- results ------------------------------------------------------------------------
    def finish(self) -> Flow:
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
