"""JSON objects to typed dataclasses, checked field by field against the type hints.

The model's type hints are the schema (``calls: int`` must hold an integer, ``steps:
list[int]`` a list of integers); ``build`` checks a JSON object against them and names
the JSON path of the first bad value, so a loader can report one line instead of failing
later.  Fields a record does not declare are kept (``keep_unknown``) for writing back.
Imports nothing of opscope but the error text helper: the model builds its parts with it.
"""
from __future__ import annotations

import dataclasses
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


def build(cls, data, where: str):
    """An instance of the dataclass ``cls`` from ``data``, every field checked against its hint."""
    if not isinstance(data, dict):
        raise SchemaError(where, f"expected an object, found {_kind(data)}")
    hints, required = _hints(cls)
    missing = sorted(required - data.keys())
    if missing:
        raise SchemaError(where, f"missing field {missing[0]!r}")
    known, unknown = {}, {}
    for key, value in data.items():
        if key in hints:
            if value is None and hints[key] is float and key not in required:
                continue   # scan.json stores NaN as null (model.json_safe): the field's default stands in
            known[key] = value_of(value, hints[key], f"{where}.{key}")
        else:
            unknown[key] = plain(value, f"{where}.{key}")
    record = cls(**known)
    record.keep_unknown(unknown)
    record.keep_read(tuple(data))
    return record


# above complexity 15: one branch per kind of type hint the schema accepts
def value_of(value, hint, where: str):  # noqa: C901
    """``value`` checked against one type hint (``str | None``, ``list[int]``, a record, ...)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options: typing.Sequence[typing.Any] = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        options = [o for o in options if o is not type(None)]
        return value_of(value, options[0], where) if len(options) == 1 else plain(value, where)
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(where, f"expected a list, found {_kind(value)}")
        (item,) = typing.get_args(hint)
        return [value_of(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(where, f"expected an object, found {_kind(value)}")
        _, item = typing.get_args(hint)
        return {k: value_of(v, item, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    if hint is str:
        if not isinstance(value, str):
            raise SchemaError(where, f"expected a string, found {_kind(value)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise SchemaError(where, f"expected true or false, found {_kind(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(where, f"expected an integer, found {_kind(value)}")
        if abs(value) >= MAX_INT:
            raise SchemaError(where, f"integer {excerpt(value)} is out of range")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(where, f"expected a number, found {_kind(value)}")
        if not (isinstance(value, float) and math.isfinite(value) or isinstance(value, int)) \
                or abs(value) > MAX_FLOAT:
            raise SchemaError(where, f"number {excerpt(value)} is out of range")
        return value
    if hint in (list, dict):
        if not isinstance(value, hint):
            raise SchemaError(where, f"expected {'a list' if hint is list else 'an object'}, found {_kind(value)}")
        return plain(value, where)
    return plain(value, where)


def plain(value, where: str):
    """Any JSON value, checked without recursion: nesting at most MAX_DEPTH, integers in range."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(where, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= MAX_INT:
            raise SchemaError(where, f"integer {excerpt(item)} is out of range")
    return value


def _kind(value) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object"}
    return f"{names.get(type(value), type(value).__name__)} {excerpt(value, 40)}"
