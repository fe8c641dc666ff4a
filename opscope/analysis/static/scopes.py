"""Python scopes for the static scan: which names each scope binds, and to what.

``Binder`` is the first pass over a parsed file (imports, simple aliases, locals per scope);
``Scope.binding`` is the one walk up the scopes Python's name lookup makes (a class body is
skipped from nested functions, ``global`` goes to the module); ``Resolver`` turns a name or
attribute chain into the qualified name it imports (``t.cuda.synchronize`` after
``import torch as t`` -> ``torch.cuda.synchronize``), and ``ScopedVisitor`` keeps the current
scope for the later passes.
"""
from __future__ import annotations

import ast


class Scope:
    __slots__ = ("parent", "is_class", "imports", "aliases", "locals", "globals")

    def __init__(self, parent, is_class=False):
        self.parent = parent
        self.is_class = is_class
        self.imports: dict[str, str] = {}
        self.aliases: dict[str, ast.expr] = {}
        self.locals: set[str] = set()
        self.globals: set[str] = set()

    def binding(self, ident: str) -> Scope | None:
        """The scope whose import, alias or local ``ident`` is here; None when none binds it."""
        s, first = self, True
        if ident in s.globals:
            while s.parent is not None:
                s = s.parent
        while s is not None:
            if s.is_class and not first:
                s = s.parent
                continue
            if ident in s.imports or ident in s.aliases or ident in s.locals:
                return s
            s, first = s.parent, False
        return None


class Binder(ast.NodeVisitor):
    """First pass: which names each scope binds, and to what (import, alias or local)."""

    def __init__(self):
        self.scopes: dict[int, Scope] = {}
        self.stack: list[Scope] = []
        self.assigned: dict[tuple[int, str], int] = {}
        self.functions: dict[tuple[int, str], ast.AST] = {}   # (id(binding scope), name) -> def / class

    def _enter(self, node, is_class=False):
        scope = Scope(self.stack[-1] if self.stack else None, is_class)
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


class Resolver:
    """The qualified name an imported name or attribute chain stands for (None: not an import)."""

    def __init__(self, scopes: dict[int, Scope]):
        self.scopes = scopes

    def name(self, ident: str, scope: Scope, depth: int = 0) -> str | None:
        if depth > 20:
            return None
        s = scope.binding(ident)
        if s is None:
            return None
        if ident in s.imports:
            return s.imports[ident]
        if ident in s.aliases:
            return self.expr(s.aliases[ident], s, depth + 1)
        return None

    def expr(self, node, scope: Scope, depth: int = 0) -> str | None:
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


class ScopedVisitor(ast.NodeVisitor):
    """A pass after binding that knows the scope it is in (``self.stack[-1]``)."""

    def __init__(self, scopes: dict[int, Scope]):
        self.scopes = scopes
        self.stack: list[Scope] = []

    def _scoped(self, node):
        self.stack.append(self.scopes[id(node)])
        self.generic_visit(node)
        self.stack.pop()

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _scoped
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _scoped
