"""Valid inputs for one captured operator signature, ready to replay.

A scan records each distinct signature as (name, overload, input shapes, profiler dtype
strings, scalars of the first call).  Here that becomes a concrete call: the ATen schema
(resolving a missing overload from the recorded argument kinds), and arguments whose
values are legal for the op: index tensors in range, variances positive, denominators
away from zero.  Which op needs what is data (``support_matrix/verify_standards.yaml``).

Tensor values come from a ``TensorSource``: ``SyntheticTensors`` draws them from a seeded
generator; ``DumpedTensors`` replays real tensors saved by a scan (``--dump-inputs``,
``RUN_DIR/inputs/<signature_key>.pt``: ``{arg_index: tensor}``) and falls back to synthetic
values for arguments it does not have.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.resources import support_matrix_dir

if TYPE_CHECKING:   # torch is imported lazily: listing and skipping need no torch
    import torch

PROFILER_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}
NON_TENSOR_KINDS = ("Scalar", "ScalarList", "TensorList", "")
SCALAR_TYPE_ARGS = ("dtype", "input_dtype", "out_dtype", "output_dtype")


class NotReplayable(Exception):
    """This signature cannot be replayed (the message says why); it is reported as skipped."""


@functools.lru_cache(maxsize=1)
def load_standards(path: str | None = None) -> dict:
    """The verify standards (thresholds, op categories, input rules) as a dict."""
    from opscope.knowledge import load_path
    target = Path(path) if path else support_matrix_dir() / "verify_standards.yaml"
    return load_path(target, "verify_standards.yaml")


def short_name(name: str) -> tuple[str, str]:
    """'aten::addmm' -> ('aten', 'addmm')."""
    ns, _, base = name.rpartition("::")
    return ns or "aten", base


def signature_key(name: str, overload: str | None, input_shapes: list, dtypes: list) -> str:
    """Stable file name for a signature's dumped inputs (same key the scan would write)."""
    text = json.dumps([name, overload or "", input_shapes, dtypes], separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def torch_dtype(profiler_dtype: str):
    import torch
    name = PROFILER_DTYPES.get(profiler_dtype)
    return getattr(torch, name) if name else None


def is_tensor_kind(profiler_dtype) -> bool:
    return profiler_dtype not in NON_TENSOR_KINDS and profiler_dtype is not None


# ---------------------------------------------------------------- schema resolution

def _type_text(arg) -> str:
    return str(arg.type)


def _accepts(arg, kind: str, scalar) -> bool:
    """Does schema argument ``arg`` accept what the profiler recorded (``kind``/``scalar``)?"""
    text = _type_text(arg)
    optional = text.startswith("Optional[")
    inner = text[len("Optional["):-1] if optional else text
    if kind == "":
        return optional or arg.has_default_value() or inner == "Device"
    if kind == "TensorList":
        return inner.startswith("List[") and "Tensor" in inner
    if kind == "ScalarList":
        return inner.startswith("List[") and "Tensor" not in inner
    if kind == "Scalar":
        return "Tensor" not in inner and not inner.startswith("List[")
    return inner == "Tensor"


def candidate_schemas(name: str):
    import torch
    return list(torch._C._jit_get_schemas_for_operator(name))


def resolve_schema(name: str, overload: str | None, dtypes: list, scalars: list):
    """The FunctionSchema of this call; ``overload`` None means: pick by argument kinds."""
    schemas = candidate_schemas(name)
    if not schemas:
        raise NotReplayable(f"{name} is not a registered operator here (its library is not loaded)")
    if overload is not None:
        for schema in schemas:
            if schema.overload_name == (overload if overload != "default" else ""):
                if len(dtypes) <= len(schema.arguments):
                    return schema
        raise NotReplayable(f"{name}.{overload or 'default'}: no such overload in this torch")
    fits = [s for s in schemas if len(s.arguments) == len(dtypes)
            and all(_accepts(a, k, v) for a, k, v in zip(s.arguments, dtypes, _pad(scalars, len(dtypes)), strict=False))]
    fits.sort(key=_is_out_variant)  # the functional overload first; out= variants when only they fit
    if not fits:
        if any("List[Optional[Tensor]]" in _type_text(a) or "List[Tensor]" in _type_text(a)
               for s in schemas for a in s.arguments):
            raise NotReplayable("tensor-list argument (e.g. advanced-indexing indices); the profiler does not "
                                "record the list's tensors")
        raise NotReplayable(f"{name}: no overload matches the recorded argument kinds {dtypes}")
    return fits[0]


def _is_out_variant(schema) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _pad(values: list, n: int) -> list:
    values = list(values or [])
    return values + [None] * (n - len(values))


# ---------------------------------------------------------------- tensor sources

@dataclass
class TensorRequest:
    """What one tensor argument must look like."""
    index: int
    name: str
    shape: tuple
    dtype: torch.dtype
    low: float | None = None  # integer tensors: [low, high)
    high: float | None = None
    domain: str = "any"      # any | positive | nonzero


class SyntheticTensors:
    """Seeded random values that respect a request's range and domain."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def tensor(self, op_key: str, request: TensorRequest):
        import torch
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(op_key[:8], 16) + request.index)
        shape, dtype = request.shape, request.dtype
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=gen).bool()
        if not dtype.is_floating_point and not dtype.is_complex:
            low = int(request.low or 0)
            high = max(int(request.high if request.high is not None else 8), low + 1)
            return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(dtype)
        values = torch.randn(shape, generator=gen, dtype=torch.float64)
        if request.domain == "positive":
            values = 0.5 + 1.5 * torch.rand(shape, generator=gen, dtype=torch.float64)
        elif request.domain == "nonzero":
            sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
            values = sign * (0.5 + 1.5 * torch.rand(shape, generator=gen, dtype=torch.float64))
        return values.to(dtype)


class DumpedTensors:
    """Real tensors dumped by a scan for some signatures; synthetic values for the rest.

    Layout: ``<run_dir>/inputs/<signature_key>.pt`` holding ``{arg_index: tensor}`` (a
    bounded sample written by ``opscope scan --dump-inputs``).  A dumped tensor is used only
    when its shape and dtype match the request.
    """

    def __init__(self, run_dir: Path, fallback: SyntheticTensors | None = None):
        self.folder = Path(run_dir) / "inputs"
        self.fallback = fallback or SyntheticTensors()
        self._cache: dict[str, dict] = {}
        self.used = 0

    def available(self) -> bool:
        return self.folder.is_dir()

    def _load(self, op_key: str) -> dict:
        if op_key not in self._cache:
            path = self.folder / f"{op_key}.pt"
            data = {}
            if path.is_file():
                import torch
                try:
                    data = torch.load(path, map_location="cpu", weights_only=True)
                except Exception:  # a damaged dump: fall back to synthetic values
                    data = {}
            self._cache = {op_key: data}  # keep one signature in memory
        return self._cache[op_key]

    def tensor(self, op_key: str, request: TensorRequest):
        real = self._load(op_key).get(request.index)
        if real is not None and tuple(real.shape) == tuple(request.shape) and real.dtype == request.dtype:
            self.used += 1
            return real.clone()
        return self.fallback.tensor(op_key, request)


# ---------------------------------------------------------------- building a call

@dataclass
class Call:
    """A ready-to-run operator call (CPU tensors in the captured dtypes)."""
    name: str
    schema: torch._C.FunctionSchema
    args: list
    kwargs: dict
    op_key: str
    tensor_args: list = field(default_factory=list)   # names of tensor arguments

    @property
    def qualified(self) -> str:
        return f"{self.name}.{self.schema.overload_name or 'default'}"

    def packet(self):
        import torch
        ns, base = short_name(self.name)
        packet = getattr(getattr(torch.ops, ns), base)
        return getattr(packet, self.schema.overload_name or "default")


def skip_reason(name: str, schema=None, standards: dict | None = None) -> str | None:
    """Why this op is not replayed (random, communication, no numeric content), or None."""
    standards = standards or load_standards()
    skip = standards.get("skip", {})
    ns, base = short_name(name)
    for group in skip.values():
        if ns in (group.get("namespaces") or []):
            return group["reason"]
    if ns != "aten":
        return f"{ns}:: op; opscope only builds inputs for aten operators"
    for group in skip.values():
        if base in (group.get("ops") or []):
            return group["reason"]
    if schema is not None:
        if any("Generator" in _type_text(a) for a in schema.arguments):
            return skip.get("random", {}).get("reason", "random op")
        ret = schema.returns[0] if schema.returns else None
        if ret is not None and ret.alias_info is not None and not ret.alias_info.is_write:
            return ("view/alias op; it can return its input itself, so there is no new numeric result "
                    "(a real copy or cast shows up as its own op, e.g. aten::_to_copy)")
    return None


def _int_range_expr(base: str, index: int, standards: dict) -> str | None:
    rules = (standards.get("inputs") or {}).get("index_ranges") or {}
    rule = rules.get(base) or {}
    return rule.get(index, rule.get(str(index)))


def _mask_ones_expr(base: str, index: int, standards: dict) -> str | None:
    rule = ((standards.get("inputs") or {}).get("mask_ones") or {}).get(base) or {}
    return rule.get(index, rule.get(str(index)))


def _rule(standards: dict, table: str, base: str, index: int):
    """``inputs.<table>.<op>.<argument position>`` of the standards, or None."""
    rule = ((standards.get("inputs") or {}).get(table) or {}).get(base) or {}
    return rule.get(index, rule.get(str(index)))


def _unique_along(value, dim: int, high: int, op_key: str, index: int):
    """Indices in [0, high) that do not repeat along ``dim`` (each line a random draw without
    replacement); unchanged where a line is longer than ``high`` (it cannot be unique)."""
    import torch
    if value.dim() == 0:
        return value
    dim = dim % value.dim()
    if value.shape[dim] > high:
        return value
    gen = torch.Generator().manual_seed(int(op_key[:8], 16) + 7919 * (index + 1))
    shape = list(value.shape)
    shape[dim] = high
    order = torch.rand(shape, generator=gen).argsort(dim=dim)
    return order.narrow(dim, 0, value.shape[dim]).to(value.dtype).contiguous()


def _offsets(value, high: int, ends_at_high: bool, op_key: str, index: int):
    """Sorted offsets in [0, high], the first 0 (and the last ``high`` when ``ends_at_high``)."""
    import torch
    if value.dim() != 1 or not value.numel():
        return value
    gen = torch.Generator().manual_seed(int(op_key[:8], 16) + 15485863 + index)
    drawn = torch.randint(0, max(high, 0) + 1, (value.numel(),), generator=gen).sort().values
    drawn[0] = 0
    if ends_at_high:
        drawn[-1] = high
    return drawn.to(value.dtype)


def derive_argument(rule: dict, built: dict, shapes: list, scalars: list, request: TensorRequest, op_key: str):
    """An argument that is another op's result (``inputs.derived``): run that op on the CPU on the
    replay's own, already built arguments and take the named output.

    The result has the requested shape and dtype, or the signature is not replayable (a
    recorded shape the forward does not produce: the scan's arguments do not belong together).
    """
    import torch
    gen = torch.Generator().manual_seed(int(op_key[:8], 16) + 104729)
    first = built.get(0)
    like = first.dtype if isinstance(first, torch.Tensor) and first.dtype.is_floating_point else torch.float32

    def arg(i):
        return built[i]

    def randn(shape):
        return torch.randn([int(d) for d in shape], generator=gen, dtype=torch.float64).to(like)

    names = {"arg": arg, "randn": randn, "shape": lambda i: [int(d) for d in (shapes[i] or [])],
             "scalar": lambda i: scalars[i] if i < len(scalars) else None, "list": list, "max": max, "min": min,
             "len": len}
    forward = getattr(torch.ops.aten, rule["op"])
    try:
        values = [eval(expr, {"__builtins__": {}}, names) for expr in rule.get("args") or []]  # noqa: S307 - our data
        with torch.no_grad():
            result = forward(*values)
    except Exception as exc:
        raise NotReplayable(f"argument {request.name} is aten::{rule['op']}'s output, which could not be rebuilt on "
                            f"the recorded arguments ({type(exc).__name__}: {str(exc)[:120]})") from None
    result = result[int(rule.get("output", 0))] if isinstance(result, (tuple, list)) else result
    if tuple(result.shape) != tuple(request.shape):
        raise NotReplayable(f"argument {request.name} is aten::{rule['op']}'s output, but that op gives shape "
                            f"{list(result.shape)} on the recorded arguments where the scan recorded "
                            f"{list(request.shape)}")
    return result.detach().to(request.dtype).clone()


def _mask_with_ones(shape, count: int, op_key: str, index: int):
    """A bool mask with exactly ``count`` True elements (capped at its size), at random places."""
    import torch
    gen = torch.Generator().manual_seed(int(op_key[:8], 16) + index)
    n = _numel(shape)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=gen)[:max(0, min(count, n))]] = True
    return mask.reshape(shape)


def _eval_high(expr: str, shapes: list, scalars: list) -> int:
    def size(arg, dim):
        shape = shapes[arg]
        return int(shape[dim]) if shape else 1

    def scalar(arg):
        value = scalars[arg] if arg < len(scalars) else None
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 8

    def numel(arg):
        n = 1
        for d in shapes[arg] or []:
            n *= int(d)
        return n

    names = {"size": size, "scalar": scalar, "numel": numel, "shape": lambda a: shapes[a], "len": len}
    return int(eval(expr, {"__builtins__": {}}, names))  # noqa: S307 - our own data file


def _default_int_high(shapes: list, dtypes: list, index: int, standards: dict) -> int:
    dims = [int(d) for i, (s, k) in enumerate(zip(shapes, dtypes, strict=False))
            if i != index and is_tensor_kind(k) for d in (s or []) if int(d) > 0]
    fallback = (standards.get("inputs") or {}).get("default_int_high", 8)
    return max(1, min(dims)) if dims else fallback


def _replayable_signature(op, standards: dict) -> tuple[list, list, list, torch._C.FunctionSchema]:
    """Recorded dtypes, padded shapes and scalars, and the schema; NotReplayable if skipped or a tensor list."""
    name = op.name
    reason = skip_reason(name, None, standards)
    if reason:
        raise NotReplayable(reason)
    dtypes = list(op.dtypes or [])
    shapes = _pad(op.input_shapes, len(dtypes))
    scalars = _pad(op.scalars, len(dtypes))
    schema = resolve_schema(name, op.overload, dtypes, scalars)
    reason = skip_reason(name, schema, standards)
    if reason:
        raise NotReplayable(reason)
    if "TensorList" in dtypes:
        raise NotReplayable("tensor-list argument; the profiler does not record the list's tensor shapes")
    return dtypes, shapes, scalars, schema


def _check_size(shapes: list, dtypes: list, max_elements: int | None) -> None:
    """NotReplayable when the tensor inputs hold more than ``max_elements`` elements in all."""
    total = sum(_numel(s) for s, k in zip(shapes, dtypes, strict=False) if is_tensor_kind(k))
    if max_elements and total > max_elements:
        raise NotReplayable(f"inputs have {total:,} elements, over --max-elements {max_elements:,} "
                            "(the float64 CPU oracle needs 8 bytes each)")


@dataclass
class _Signature:
    """What every argument of one call is built from: the recorded signature and the input rules."""
    base: str
    dtypes: list
    shapes: list
    scalars: list
    key: str
    standards: dict
    source: SyntheticTensors | DumpedTensors
    positive_ops: set
    nonzero_ops: set
    positive_args: set
    built: dict = field(default_factory=dict)   # argument position -> value, for arguments derived from earlier ones


def _tensor_request(arg, index: int, dtype, sig: _Signature) -> TensorRequest:
    """What tensor argument ``index`` must look like: its shape and dtype, an integer range or a value domain."""
    import torch
    request = TensorRequest(index, arg.name, tuple(int(d) for d in (sig.shapes[index] or [])), dtype)
    if not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool):
        expr = _int_range_expr(sig.base, index, sig.standards)
        request.low = 0
        request.high = (_eval_high(expr, sig.shapes, sig.scalars) if expr
                        else _default_int_high(sig.shapes, sig.dtypes, index, sig.standards))
    elif arg.name in sig.positive_args or sig.base in sig.positive_ops:
        request.domain = "positive"
    elif sig.base in sig.nonzero_ops:
        request.domain = "nonzero"
    return request


def _tensor_value(arg, index: int, sig: _Signature):
    """A tensor argument's value from the source, reshaped by the op's rules (mask ones, offsets, unique, derived)."""
    import torch
    kind = sig.dtypes[index]
    dtype = torch_dtype(kind)
    if dtype is None:
        raise NotReplayable(f"argument {arg.name} has dtype {kind}, which opscope cannot build")
    request = _tensor_request(arg, index, dtype, sig)
    base, shapes, scalars, key = sig.base, sig.shapes, sig.scalars, sig.key
    value = sig.source.tensor(key, request)
    ones = _mask_ones_expr(base, index, sig.standards) if dtype == torch.bool else None
    if ones:
        value = _mask_with_ones(value.shape, _eval_high(ones, shapes, scalars), key, index)
    offsets = _rule(sig.standards, "offsets", base, index)
    if offsets is not None and not dtype.is_floating_point and dtype != torch.bool:
        value = _offsets(value, _eval_high(offsets["high"], shapes, scalars),
                         bool(scalars[offsets["last"]]) if "last" in offsets else False, key, index)
    along = _rule(sig.standards, "unique_along", base, index)
    if along is not None and not dtype.is_floating_point and dtype != torch.bool:
        value = _unique_along(value, _eval_high(along, shapes, scalars), int(request.high or 1), key, index)
    derived = _rule(sig.standards, "derived", base, index)
    if derived is not None:
        value = derive_argument(derived, sig.built, shapes, scalars, request, key)
    return value


def _other_value(arg, kind: str, scalar, dtypes: list):
    """A non-tensor argument's value: a default for what the profiler did not record, else the recorded scalar."""
    if kind == "":
        text = _type_text(arg)
        if text.startswith("Optional["):
            return None
        if "Device" in text:
            return "cpu"            # moved to the device under test by the runner
        return arg.default_value    # e.g. gelu's str `approximate`: recorded as None
    if scalar is None and kind in ("Scalar", "ScalarList"):
        if not arg.has_default_value():
            raise NotReplayable(f"argument {arg.name} was not recorded and has no default")
        return arg.default_value
    return _scalar_value(arg, scalar, "bool" in dtypes)


def build_call(op, source=None, standards: dict | None = None, max_elements: int | None = None) -> Call:
    """Turn a captured signature (an ``Operator`` or anything with its fields) into a Call.

    Raises NotReplayable with the reason when it cannot or should not be replayed.
    """
    import torch  # noqa: F401 - replaying needs torch: fail on its absence first, before any skip reason
    standards = standards or load_standards()
    name = op.name
    dtypes, shapes, scalars, schema = _replayable_signature(op, standards)
    source = source or SyntheticTensors()
    _, base = short_name(name)
    inputs = standards.get("inputs") or {}
    positive_ops = set(inputs.get("positive") or [])
    nonzero_ops = set(inputs.get("nonzero") or [])
    positive_args = set(inputs.get("positive_args") or [])
    key = signature_key(name, op.overload, op.input_shapes, op.dtypes)
    _check_size(shapes, dtypes, max_elements)
    sig = _Signature(base, dtypes, shapes, scalars, key, standards, source, positive_ops, nonzero_ops, positive_args)
    args, kwargs, tensor_args = [], {}, []
    for index, arg in enumerate(schema.arguments):
        if index < len(dtypes):
            if is_tensor_kind(dtypes[index]):
                value = _tensor_value(arg, index, sig)
                tensor_args.append(arg.name)
            else:
                value = _other_value(arg, dtypes[index], scalars[index], dtypes)
        elif arg.has_default_value():
            continue
        else:
            raise NotReplayable(f"argument {arg.name} was not recorded and has no default")
        sig.built[index] = value
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return Call(name=name, schema=schema, args=args, kwargs=kwargs, op_key=key, tensor_args=tensor_args)


def _scalar_value(arg, value, bool_tensors: bool = False):
    """Recorded scalars are JSON values; a few schema types need them converted back.

    A number recorded as a bool (the profiler writes add_'s alpha=1 as ``true``) is that number
    again, unless a tensor of the call is bool (then True is meant)."""
    text = _type_text(arg)
    if isinstance(value, bool) and text in ("Scalar", "number") and not bool_tensors:
        return int(value)
    if "Device" in text and value is not None:
        return None if not isinstance(value, str) else value
    if isinstance(value, list) and "List[bool]" in text:
        return [bool(v) for v in value]
    return value


def _numel(shape) -> int:
    n = 1
    for d in shape or []:
        n *= int(d)
    return n
