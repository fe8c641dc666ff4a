"""JSON objects to typed dataclasses, checked field by field against the type hints.

The model's type hints are the schema (``calls: int`` must hold an integer, ``steps:
list[int]`` a list of integers); ``build`` checks a JSON object against them and names
the JSON path of the first bad value, so a loader can report one line instead of failing
later.  Fields a record does not declare are kept (``keep_unknown``) for writing back.  A field named
after a Python keyword with a trailing underscore (``from_``) reads its JSON key without it (``from``).
Imports nothing of opscope but the error text helper: the model builds its parts with it.
"""
from __future__ import annotations

import dataclasses
import keyword
import math
import types
import typing
from functools import cache

from opscope.errors import excerpt

MAX_DEPTH = 32               # JSON nesting anywhere in scan.json (real files stay under 8)
MAX_INT = 2 ** 63            # integers beyond a 64-bit counter are not counts, they are garbage
MAX_FLOAT = 1e300            # finite and far from overflow when summed or formatted

class SchemaError(ValueError):
    """A value of the wrong type or range; ``where`` is its JSON path."""

    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where, self.problem = where, problem


@cache
def _hints(cls) -> tuple[dict, frozenset]:
    fields = dataclasses.fields(cls)
    required = frozenset(f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return typing.get_type_hints(cls), required


class _Bad(Exception):
    """A bad value found while checking; ``path`` collects the JSON path on the way out
    (innermost first), so the happy path never formats one."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []

    def at(self, where: str) -> SchemaError:
        return SchemaError(where + "".join(reversed(self.path)), self.problem)


def build(cls, data, where: str):
    """An instance of the dataclass ``cls`` from ``data``, every field checked against its hint."""
    try:
        return _build(cls, data)
    except _Bad as bad:
        raise bad.at(where) from None


def value_of(value, hint, where: str):
    """``value`` checked against one type hint (``str | None``, ``list[int]``, a record, ...)."""
    try:
        return _checker(hint)(value)
    except _Bad as bad:
        raise bad.at(where) from None


def plain(value, where: str):
    """Any JSON value, checked without recursion: nesting at most MAX_DEPTH, integers in range."""
    try:
        return _plain(value)
    except _Bad as bad:
        raise bad.at(where) from None


def json_key(name: str) -> str:
    """The JSON key of a field: ``from_`` is ``from`` (a field cannot be named after a Python keyword)."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


@cache
def _fields(cls) -> tuple[dict, frozenset, frozenset, dict[str, str]]:
    """(JSON key -> checker, required keys, optional float keys, renamed keys -> field) of a record type."""
    hints, required = _hints(cls)
    optional_floats = frozenset(json_key(k) for k, h in hints.items() if h is float and k not in required)
    renamed = {json_key(k): k for k in hints if json_key(k) != k}
    return ({json_key(k): _checker(h) for k, h in hints.items()}, frozenset(json_key(k) for k in required),
            optional_floats, renamed)


def _build(cls, data):
    if not isinstance(data, dict):
        raise _Bad(f"expected an object, found {_kind(data)}")
    checkers, required, optional_floats, renamed = _fields(cls)
    if not required <= data.keys():
        raise _Bad(f"missing field {sorted(required - data.keys())[0]!r}")
    known: dict[str, typing.Any] = {}
    unknown: dict[str, typing.Any] = {}
    for key, value in data.items():
        check = checkers.get(key)
        try:
            if check is not None:
                if value is None and key in optional_floats:
                    continue   # scan.json stores NaN as null (model.json_safe): the field's default stands in
                known[renamed[key] if key in renamed else key] = check(value)
            else:
                unknown[key] = _plain(value)
        except _Bad as bad:
            bad.path.append(f".{key}")
            raise
    record = cls(**known)
    record.keep_unknown(unknown)
    record.keep_read(tuple(data))
    return record


@cache
def _checker(hint):  # noqa: C901  # one branch per kind of type hint the schema accepts
    """The check for one type hint, made once per hint: value -> value, or raises ``_Bad``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        nullable = len(options) < len(typing.get_args(hint))
        inner = _checker(options[0]) if len(options) == 1 else _plain

        def union(value):
            return None if value is None and nullable else inner(value)
        return union
    if origin is list:
        (item,) = typing.get_args(hint)
        return _list_of(_checker(item))
    if origin is dict:
        return _dict_of(_checker(typing.get_args(hint)[1]))
    if dataclasses.is_dataclass(hint):
        return lambda value: _build(hint, value)
    if hint in _LEAVES:
        return _LEAVES[hint]
    if hint in (list, dict):
        what = "a list" if hint is list else "an object"

        def container(value):
            if not isinstance(value, hint):
                raise _Bad(f"expected {what}, found {_kind(value)}")
            return _plain(value)
        return container
    return _plain


def _list_of(item):
    def check(value):
        if not isinstance(value, list):
            raise _Bad(f"expected a list, found {_kind(value)}")
        try:
            return [item(v) for v in value]
        except _Bad as bad:   # only now: which item it was
            for i, v in enumerate(value):
                try:
                    item(v)
                except _Bad:
                    bad.path.append(f"[{i}]")
                    break
            raise
    return check


def _dict_of(item):
    def check(value):
        if not isinstance(value, dict):
            raise _Bad(f"expected an object, found {_kind(value)}")
        out = {}
        for k, v in value.items():
            try:
                out[k] = item(v)
            except _Bad as bad:
                bad.path.append(f".{k}")
                raise
        return out
    return check


def _string(value):
    if type(value) is not str and not isinstance(value, str):
        raise _Bad(f"expected a string, found {_kind(value)}")
    return value


def _boolean(value):
    if not isinstance(value, bool):
        raise _Bad(f"expected true or false, found {_kind(value)}")
    return value


def _integer(value):
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _Bad(f"expected an integer, found {_kind(value)}")
    if not -MAX_INT < value < MAX_INT:
        raise _Bad(f"integer {excerpt(value)} is out of range")
    return value


def _number(value):
    kind = type(value)
    if kind is float:
        if not -MAX_FLOAT <= value <= MAX_FLOAT:   # also false for NaN
            raise _Bad(f"number {excerpt(value)} is out of range")
        return value
    if kind is bool or not isinstance(value, (int, float)):
        raise _Bad(f"expected a number, found {_kind(value)}")
    if not (isinstance(value, float) and math.isfinite(value) or isinstance(value, int)) or abs(value) > MAX_FLOAT:
        raise _Bad(f"number {excerpt(value)} is out of range")
    return value


_LEAVES = {str: _string, bool: _boolean, int: _integer, float: _number}


def _plain(value):
    """``plain`` without a path: the caller's path is where the bad value is."""
    if type(value) in _SCALARS:
        return value
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise _Bad(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= MAX_INT:
            raise _Bad(f"integer {excerpt(item)} is out of range")
    return value


_SCALARS = frozenset({str, float, bool, type(None)})


def _kind(value) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object"}
    return f"{names.get(type(value), type(value).__name__)} {excerpt(value, 40)}"
