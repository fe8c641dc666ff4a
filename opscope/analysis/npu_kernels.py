"""ATen operators as the NPU kernels they become, and the rules that say why one is slow.

One pricing function per ``model`` named in ``support_matrix/npu_cost_model.yaml``
(``MODELS``: conv, matmul, attention, ...), the TransData the NPU inserts around them,
AI CPU and alignment reasons, and fusable op sequences.  Chip-independent: the prices are
put on by ``npu_estimate.price``.
"""
from __future__ import annotations

from opscope.analysis.npu_cost import Kernel, dtype_bytes, dtype_name, numel, tensor_bytes


def base_name(name: str) -> str:
    return name.split("::", 1)[1] if "::" in name else name


_TENSORS: dict[int, list] = {}   # id(op) -> op_tensors(op), for the duration of one build_basis


def op_tensors(op) -> list[tuple[list, str]]:
    """(shape, torch dtype) of each tensor input with at least one dimension."""
    cached = _TENSORS.get(id(op))
    if cached is not None:
        return cached
    out = []
    for i, shape in enumerate(op.input_shapes or []):
        dtype = op.dtypes[i] if i < len(op.dtypes or []) else ""
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape) and dtype \
                and dtype not in ("Scalar", "ScalarList", "TensorList", "GenericList", ""):
            out.append((shape, dtype_name(dtype)))
    return out


def cache_tensors(operators) -> None:
    _TENSORS.clear()
    for op in operators:
        _TENSORS[id(op)] = op_tensors(op)


def clear_tensors() -> None:
    _TENSORS.clear()


def _float_dtype(op) -> str:
    return next((d for _, d in op_tensors(op) if d.startswith(("float", "bfloat"))), "float32")


# --- ATen operator -> kernels: one function per `model` named in npu_cost_model.yaml ---

def _conv_out(op) -> list | None:
    x, w = op.input_shapes[0], op.input_shapes[1]
    sc = op.scalars or []
    stride, padding, dilation = (sc[3] if len(sc) > 3 else [1, 1]), (sc[4] if len(sc) > 4 else [0, 0]), \
        (sc[5] if len(sc) > 5 else [1, 1])
    try:
        spatial = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
                   for i in range(len(x) - 2)]
    except (IndexError, TypeError):
        return None
    return [x[0], w[0], *spatial]


def _model_conv(op, names) -> list[Kernel]:
    x, w = op.input_shapes[0], op.input_shapes[1]
    out = _conv_out(op) or x
    k = numel(w[1:])
    dtype = _float_dtype(op)
    size = dtype_bytes(dtype)
    moved = (numel(x) + numel(w) + numel(out)) * size
    return [Kernel(names[0], "cube", 2.0 * numel(out) * k, moved, dtype, shapes=[x, w, out])]


def _model_conv_backward(op, names) -> list[Kernel]:
    dy, x, w = op.input_shapes[0], op.input_shapes[1], op.input_shapes[2]
    mask = next((s for s in reversed(op.scalars or []) if isinstance(s, list) and s and isinstance(s[0], bool)),
                [True, True, True])
    dtype = _float_dtype(op)
    size = dtype_bytes(dtype)
    flops = 2.0 * numel(dy) * numel(w[1:])
    kernels = []
    if mask[0]:
        kernels.append(Kernel(names[0], "cube", flops, (numel(dy) + numel(w) + numel(x)) * size, dtype))
    if len(mask) > 1 and mask[1]:
        kernels.append(Kernel(names[1], "cube", flops, (numel(dy) + numel(w) + numel(x)) * size, dtype))
    if len(mask) > 2 and mask[2]:
        kernels.append(Kernel(names[2], "vector", 0.0, (numel(dy) + w[0]) * size, dtype))
    return kernels


def matmul_dims(op) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of a matmul-family operator from its input shapes."""
    name = base_name(op.name)
    shapes = [s for s, _ in op_tensors(op)]
    try:
        if name in ("addmm", "baddbmm"):
            shapes = shapes[1:] if len(shapes) >= 3 else shapes
        a, b = shapes[0], shapes[1]
        if name == "linear":
            return numel(a[:-1]), 1, a[-1], b[0]
        if len(b) == 1:
            return 1, numel(a[:-1]), a[-1], 1
        batch = numel(a[:-2]) if len(a) > 2 else 1
        return batch, a[-2] if len(a) > 1 else 1, a[-1], b[-1]
    except (IndexError, TypeError):
        return None


def _model_matmul(op, names) -> list[Kernel]:
    dims = matmul_dims(op)
    if dims is None:
        return model_elementwise(op, names)
    batch, m, k, n = dims
    dtype = _float_dtype(op)
    size = dtype_bytes(dtype)
    moved = tensor_bytes(*zip(*op_tensors(op), strict=True)) if op_tensors(op) else 0.0
    moved += batch * m * n * size
    return [Kernel(names[0], "cube", 2.0 * batch * m * k * n, moved, dtype, written=batch * m * n * size)]


def _model_attention(op, names) -> list[Kernel]:
    tensors = op_tensors(op)
    if len(tensors) < 2:
        return model_elementwise(op, names)
    q, k = tensors[0][0], tensors[1][0]
    causal = any(s is True for s in (op.scalars or [])[3:6])
    flops = 4.0 * numel(q) * (k[-2] if len(k) >= 2 else 1) * (0.5 if causal else 1.0)
    if names[0].endswith("Grad"):
        flops *= 2.5
    return [Kernel(names[0], "fa", flops, tensor_bytes(*zip(*tensors, strict=True)) * 2, tensors[0][1])]


def _model_pool(op, names) -> list[Kernel]:
    x = op.input_shapes[0]
    sc = op.scalars or []
    kernel, stride = (sc[1] if len(sc) > 1 else [2, 2]), (sc[2] if len(sc) > 2 and sc[2] else None)
    stride = stride or kernel
    try:
        out = [x[0], x[1], *[(x[2 + i] - kernel[i]) // stride[i] + 1 for i in range(2)]]
    except (IndexError, TypeError):
        out = x
    dtype = _float_dtype(op)
    # y and the argmax mask (one bit per window element, stored as uint16) are written
    moved = numel(x) * dtype_bytes(dtype) + numel(out) * dtype_bytes(dtype) * 2
    return [Kernel(names[0], "vector", 0.0, moved, dtype)]


def _model_pool_backward(op, names) -> list[Kernel]:
    dy, x = op.input_shapes[0], op.input_shapes[1]
    dtype = _float_dtype(op)
    moved = (numel(dy) * 2 + numel(x) * 2) * dtype_bytes(dtype)
    return [Kernel(names[0], "vector", 0.0, moved, dtype)]


def model_elementwise(op, names) -> list[Kernel]:
    tensors = op_tensors(op)
    moved = tensor_bytes(*zip(*tensors, strict=True)) if tensors else 0.0
    if tensors:   # the output: the biggest input's size
        shape, dtype = max(tensors, key=lambda t: numel(t[0]))
        moved += numel(shape) * dtype_bytes(dtype)
    return [Kernel(n, "vector", 0.0, moved, _float_dtype(op)) for n in names]


def _model_reduce(op, names) -> list[Kernel]:
    tensors = op_tensors(op)
    moved = tensor_bytes(*zip(*tensors, strict=True)) if tensors else 0.0
    return [Kernel(n, "vector", 0.0, moved, _float_dtype(op)) for n in names]


def _model_foreach(op, names) -> list[Kernel]:
    lists = [s for s in (op.input_shapes or []) if isinstance(s, list) and s and isinstance(s[0], list)]
    per_list = sum(numel(s) for s in lists[0]) * 4 if lists else 0
    return [Kernel(n, "vector", 0.0, per_list * (len(lists) + 1), _float_dtype(op)) for n in names]


MODELS = {"conv": _model_conv, "conv_backward": _model_conv_backward, "matmul": _model_matmul,
          "attention": _model_attention, "pool": _model_pool, "pool_backward": _model_pool_backward,
          "elementwise": model_elementwise, "reduce": _model_reduce, "foreach": _model_foreach}


def transdata(op, rule: dict, kernels: list[Kernel]) -> list[Kernel]:
    """The TransData kernels the NPU wraps around ``op`` (bytes: base read + padded write)."""
    shapes = op.input_shapes or []
    dtype = _float_dtype(op)
    size = dtype_bytes(dtype)
    c0_cube = 8 if size == 4 else 16
    input_grad = any(k.type.endswith("BackpropInput") for k in kernels) or base_name(op.name).endswith("pool2d_with_indices_backward")
    out = []
    for spec in rule.get("tensors") or []:
        if spec.get("when") == "input_grad" and not input_grad:
            continue
        which = spec["tensor"]
        if which.startswith("input") and which[5:].isdigit():
            idx = int(which[5:])
            shape = shapes[idx] if idx < len(shapes) else None
        elif which == "output":
            shape = _conv_out(op) if base_name(op.name) in ("convolution", "_convolution") else None
            if shape is None and kernels and base_name(op.name).startswith("max_pool2d"):
                x = shapes[0]
                shape = [x[0], x[1], max(1, x[2] // 2), max(1, x[3] // 2)] if len(x) == 4 else x
        elif which == "weight_grad":
            shape = shapes[2] if len(shapes) > 2 else None
        elif which == "input_grad":
            shape = shapes[1] if len(shapes) > 1 else None
        else:
            shape = None
        if not isinstance(shape, list) or len(shape) < 2:
            continue
        c0 = c0_cube if spec.get("c0") == "cube" else int(spec.get("c0", 16))
        channels = shape[1]   # NCHW: the channel axis is padded to C0 in the private formats
        padded = numel(shape) // max(channels, 1) * (-(-channels // c0) * c0)
        out.append(Kernel("TransData", "vector", 0.0, (numel(shape) + padded) * size, dtype, inserted=True,
                          note=f"{'x'.join(map(str, shape))} -> {spec['to']}"))
    return out


def nz_transdata(op, rule: dict | None) -> list[Kernel]:
    """ND <-> FRACTAL_NZ around a matmul (chips whose cube reads NZ only: the rule's families); each
    converted tensor is read and written once."""
    dims = matmul_dims(op) if rule and base_name(op.name) in MATMULS else None
    if dims is None:
        return []
    batch, m, k, n = dims
    size = dtype_bytes(_float_dtype(op))
    moved = [batch * m * k * size, k * n * size, batch * m * n * size]   # a, b in; the result back to ND
    return [Kernel("TransData", "vector", 0.0, 2.0 * b, _float_dtype(op), inserted=True,
                   note=f"{'x'.join(map(str, shape))} <-> FRACTAL_NZ")
            for b, shape in zip(moved, ([batch * m, k], [k, n], [batch * m, n]), strict=True)]


MATMULS = ("mm", "addmm", "matmul", "linear", "bmm", "baddbmm")


# --- rules that explain why a signature is slow ---

def aicpu_reason(op, rules: dict) -> str | None:
    name = base_name(op.name)
    special = (rules.get("ops") or {}).get(name)
    odd = sorted({d for _, d in op_tensors(op) if not d.startswith(("float", "bfloat"))})
    if special:
        return f"{special.get('why', 'runs on AI CPU')}" + (f" (inputs {', '.join(odd)})" if odd else "")
    table = (rules.get("aicore_dtypes") or {}).get(str(rules.get("cann")), {})
    allowed = (table.get("ops") or {}).get(name) or table.get("default") or []
    bad = sorted({d for _, d in op_tensors(op) if d not in allowed})
    if bad and allowed:
        return f"dtype {', '.join(bad)} is not an AI Core dtype of {name} (CANN {rules.get('cann')}): runs on AI CPU"
    return None


def alignment_reason(op, rules: dict) -> str | None:
    name = base_name(op.name)
    if name in MATMULS:
        dims = matmul_dims(op)
        rule = rules.get("matmul") or {}
        if dims and rule:
            batch, m, k, n = dims
            bad = [f"{axis}={v}" for axis, v in (("K", k), ("N", n)) if v % int(rule["multiple"])]
            if bad and batch * m * k * n >= 1 << 20:
                return f"unaligned matmul: {', '.join(bad)} not a multiple of {rule['multiple']}"
    if "attention" in name:
        tensors = op_tensors(op)
        rule = rules.get("attention") or {}
        if tensors and rule and len(tensors[0][0]) >= 2:
            d, s = tensors[0][0][-1], tensors[0][0][-2]
            bad = [f"{axis}={v}" for axis, v in (("D", d), ("S", s)) if v % int(rule["multiple"])]
            if bad:
                return f"unaligned attention: {', '.join(bad)} not a multiple of {rule['multiple']}"
    return None


def match_fused_patterns(calls, patterns: list[dict], views: set) -> list[dict]:
    """Fusable op sequences in the forward top-level op stream of the first steady step."""
    stream = [c for c in calls if c.parent is None and c.phase == "forward" and base_name(c.name) not in views]
    if not stream:
        return []
    steps = sorted({c.step for c in stream})
    step = steps[1] if len(steps) > 1 else steps[0]
    stream = sorted((c for c in stream if c.step == step), key=lambda c: (c.start_us, c.seq_nr))
    names = [base_name(c.name).rstrip("_") if not base_name(c.name).startswith("_") else base_name(c.name) for c in stream]
    found: dict[tuple, dict] = {}
    for pattern in patterns:
        specs = [s if isinstance(s, dict) else {"names": s} for s in pattern.get("steps") or []]
        i = 0
        while i < len(names):
            end = _match_at(names, i, specs)
            if end is None:
                i += 1
                continue
            sources = [stream[j].source for j in range(i, end) if stream[j].source]
            key = (pattern["api"], sources[0] if sources else None)
            entry = found.setdefault(key, {"api": pattern["api"], "ops": names[i:end], "sources": sorted(set(sources)),
                                           "source": sources[0] if sources else None, "count": 0,
                                           "fix": pattern.get("fix", ""), "launches": end - i,
                                           "min_cann": pattern.get("min_cann")})
            entry["count"] += max(int(getattr(stream[i], "count", 1) or 1), 1)
            i = end
    return list(found.values())


def _match_at(names: list[str], i: int, specs: list[dict]) -> int | None:
    pos = i
    for spec in specs:
        allowed = set(spec.get("names") or [])
        hits = 0
        while pos < len(names) and names[pos] in allowed and hits < int(spec.get("repeat", 1)):
            pos += 1
            hits += 1
        if hits == 0 and not spec.get("optional"):
            return None
    return pos if pos - i >= 2 else None
