"""Resolve the ATen overload of a profiled call from its recorded argument kinds.

The profiler records ``aten::add`` with argument type strings (``float``, ``Scalar``,
``TensorList``, ``""`` for None) but not which overload ran.  The dispatcher's schemas
tell us; when exactly one non-``out`` schema fits the argument kinds, that is the overload.

A leaf helper: the capture child resolves each folded call's overload as it writes the step (torch is
imported there), so reading a capture back (``opscope report`` of a killed scan) needs no torch; the
analysis resolves what an older capture or another profile left unresolved.
"""
from __future__ import annotations

from functools import lru_cache

_NON_TENSOR = {"Scalar": "scalar", "ScalarList": "list", "TensorList": "tensorlist", "": "none",
               "GenericList": "list"}


def arg_kind(dtype: str) -> str:
    return _NON_TENSOR.get(dtype, "tensor")


def _schema_kind(arg) -> set[str]:
    t = str(arg.type)
    kinds: set[str] = set()
    optional = t.endswith("?") or t.startswith("Optional[")
    base = t[len("Optional["):-1] if t.startswith("Optional[") else t.rstrip("?")
    if base in ("Tensor",):
        kinds.add("tensor")
    elif base in ("Tensor[]", "List[Tensor]", "Tensor?[]", "List[Optional[Tensor]]"):
        kinds.update({"tensorlist", "list", "none"})  # the profiler records Tensor?[] as ""
    elif base.endswith("[]") or base.startswith("List["):
        kinds.add("list")
    else:
        kinds.add("scalar")
    if optional:
        kinds.add("none")
    return kinds


@lru_cache(maxsize=4096)
def resolve_overload(name: str, kinds: tuple[str, ...]) -> str | None:
    """Overload name ('' for the default overload) or None when unknown/ambiguous."""
    if "::" not in name:
        return None
    try:
        import torch
        schemas = torch._C._jit_get_schemas_for_operator(name)
    except Exception:
        return None
    matches = []
    for schema in schemas:
        if "out" in schema.overload_name.split("_") or schema.overload_name.endswith("out"):
            continue
        args = schema.arguments
        if len(args) != len(kinds):
            continue
        if all(kind in _schema_kind(arg) for kind, arg in zip(kinds, args, strict=True)):
            matches.append(schema.overload_name)
    if len(matches) == 1:
        return matches[0]
    return None


def overload_for(name: str, dtypes: list) -> str | None:
    try:
        return _overload_for(name, tuple(dtypes))   # once per (name, dtypes): every call of a scan asks
    except TypeError:   # a dtype entry that is not a string (an unhashable value from a hostile file)
        return resolve_overload(name, tuple(arg_kind(d) for d in dtypes))


@lru_cache(maxsize=8192)
def _overload_for(name: str, dtypes: tuple) -> str | None:
    return resolve_overload(name, tuple(arg_kind(d) for d in dtypes))
