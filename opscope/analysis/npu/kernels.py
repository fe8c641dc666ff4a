"""ATen operators as the NPU kernels they become, and the rules that say why one is slow.

One pricing function per ``model`` named in ``support_matrix/npu_cost_model.yaml``
(``MODELS``: conv, matmul, attention, ...), the TransData the NPU inserts around them,
AI CPU and alignment reasons, and fusable op sequences.  Chip-independent: the prices are
put on by ``npu_estimate.price``.
"""
from __future__ import annotations

import copy

from opscope.analysis.npu.cost import Kernel, cost_model, dtype_bytes, dtype_name, numel, tensor_bytes
from opscope.knowledge import backend_kernel


def base_name(name: str) -> str:
    return name.split("::", 1)[1] if "::" in name else name


_TENSORS: dict[int, list] = {}   # id(op) -> op_tensors(op), for the duration of one build_basis
_LISTS: dict[int, list] = {}     # id(op) -> its tensor lists recovered by build_basis (see tensor_lists)
LIST_DTYPES = ("TensorList", "TensorList?", "Tensor?[]", "Tensor[]")


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
    _LISTS.clear()


def nested_lists(op) -> list[list]:
    """The tensor lists of ``op`` as the profiler's structured input shapes give them (one list of
    dimension lists per TensorList input); [] where the capture kept only empty shapes."""
    out = []
    for i, shape in enumerate(op.input_shapes or []):
        dtype = op.dtypes[i] if i < len(op.dtypes or []) else ""
        if isinstance(shape, list) and shape and all(isinstance(s, list) for s in shape):
            out.append([s for s in shape if all(isinstance(d, int) for d in s)])
        elif dtype in LIST_DTYPES and shape == []:
            out.append([])
    return out if any(out) else []


def set_tensor_lists(op, lists: list[tuple[list, str]]) -> None:
    """Recovered (shapes, dtype) of each tensor list of ``op`` (build_basis: from the per-tensor
    children the CPU ran, or the optimizer's parameter shapes)."""
    _LISTS[id(op)] = lists


def tensor_lists(op) -> list[tuple[list, str]]:
    """(shapes, torch dtype) of each TensorList input: recorded, else recovered, else []."""
    recorded = nested_lists(op)
    if recorded:
        dtype = _float_dtype(op)
        return [(shapes, dtype) for shapes in recorded]
    return _LISTS.get(id(op), [])


def list_bytes(lst: tuple[list, str]) -> float:
    shapes, dtype = lst
    return float(sum(numel(s) for s in shapes) * dtype_bytes(dtype))


def _float_dtype(op) -> str:
    return next((d for _, d in op_tensors(op) if d.startswith(("float", "bfloat"))), "float32")


# --- a backend's own kernel priced as the public op it implements ---

def folded_backend_kernel(op) -> dict | None:
    """The backend kernel folded into ``op`` that implements a public op (``_batch_norm_impl_index`` ran
    ``aten::cudnn_batch_norm``: the scan lists it as "aten::cudnn_batch_norm (backend-private)")."""
    for child in op.children or []:
        name, _, tag = child.partition(" (")
        kernel = backend_kernel(name) if tag else None
        if kernel:
            return kernel
    return None


def cost_entry(op, aten: dict) -> tuple[str, dict | None, object, dict | None]:
    """(name priced, its ``aten`` entry in npu_cost_model.yaml or None, the operator with its arguments in
    that entry's order, the backend kernel it stands for or None).  An operator without an entry of its own
    that is a backend's kernel for a public op (``backend_private_ops.yaml`` ``implements``: cuDNN's SDPA
    backward, cuDNN's batch norm), or whose folded kernel is one, is priced as that public op."""
    name = base_name(op.name)
    entry = aten.get(name)
    if entry:
        return name, entry, op, None
    own = backend_kernel(op.name)
    kernel = own or folded_backend_kernel(op)
    if kernel:
        key = str(kernel.get("priced_as") or base_name(kernel["op"]))
        entry = aten.get(key)
        if entry:
            return key, entry, as_arguments_of(op, key, kernel.get("args") if own else None), kernel
    return name, None, op, None


def as_arguments_of(op, name: str, args: list | None):
    """A copy of ``op`` named ``aten::name`` whose argument lists are in that op's order: ``args[i]`` is the
    position in ``op`` of the i-th argument (None: ``op`` has none); ``args`` None keeps the order."""
    out = copy.copy(op)
    out.name = f"aten::{name}"
    if args:
        def pick(values, empty):
            values = list(values or [])
            return [values[i] if i is not None and i < len(values) else empty for i in args]
        out.input_shapes = pick(op.input_shapes, [])
        out.dtypes = pick(op.dtypes, "")
        out.scalars = pick(op.scalars, None)
    return out


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
    """Flash attention: 4*B*N*Sq*Skv*D FLOPs (half when causal over a square score matrix; grad 2.5x), reading
    its inputs once and writing its output (the gradient: dq, dk, dv).  A decode step (Sq = 1) reads K and V
    once, like any other shape."""
    tensors = op_tensors(op)
    grad = names[0].endswith("Grad")
    first = 1 if grad and len(tensors) >= 4 else 0   # the gradient kernel's inputs start with grad_out
    if len(tensors) < first + 2:
        return model_elementwise(op, names)
    q, k = tensors[first][0], tensors[first + 1][0]
    v = tensors[first + 2][0] if len(tensors) > first + 2 else k
    sq, skv = (q[-2] if len(q) >= 2 else 1), (k[-2] if len(k) >= 2 else 1)
    causal = any(s is True for s in (op.scalars or [])[3:9]) and sq == skv
    flops = 4.0 * numel(q) * skv * (0.5 if causal else 1.0)
    size = dtype_bytes(tensors[first][1])
    read = tensor_bytes(*zip(*tensors, strict=True))
    if grad:
        flops *= 2.5
        written = (numel(q) + numel(k) + numel(v)) * size
    else:
        written = numel(q) // max(q[-1], 1) * (v[-1] if v else 1) * size
    return [Kernel(names[0], "fa", flops, read + written, tensors[first][1], written=written)]


def _model_attention_math(op, names) -> list[Kernel]:
    """Attention as ATen's math path computes it where no fused kernel exists: scores = q @ k^T (batched),
    softmax over them, out = probs @ v; its gradient: the two products' four gradients and the softmax's.
    ``names``: [batched matmul, softmax, softmax grad].  On a chip whose cube reads FRACTAL_NZ, each product
    converts its two operands and its result (TransData, as any matmul there)."""
    tensors = op_tensors(op)
    grad = "backward" in base_name(op.name)
    first = 1 if grad and len(tensors) >= 4 else 0
    if len(tensors) < first + 2:
        return model_elementwise(op, names[:1])
    (q, dtype), k = tensors[first], tensors[first + 1][0]
    v = tensors[first + 2][0] if len(tensors) > first + 2 else k
    if len(q) < 2 or len(k) < 2:
        return model_elementwise(op, names[:1])
    size = dtype_bytes(dtype)
    heads, sq, d, skv, dv = numel(q[:-2]), q[-2], q[-1], k[-2], v[-1]
    scores = heads * sq * skv * size
    products = [(sq, d, skv), (sq, skv, dv)]              # q @ k^T, probs @ v
    if grad:   # d(probs) = dout @ v^T, dv = probs^T @ dout, dq = dscores @ k, dk = dscores^T @ q
        products = [(sq, dv, skv), (skv, sq, dv), (sq, skv, d), (skv, sq, d)]
    kernels = []
    for m, kk, n in products:
        kernels.append(Kernel(names[0], "cube", 2.0 * heads * m * kk * n, heads * (m * kk + kk * n + m * n) * size,
                              dtype, written=heads * m * n * size))
        kernels += [Kernel("TransData", "vector", 0.0, 2.0 * heads * b * size, dtype, inserted=True,
                           note=f"{heads}x{'x'.join(map(str, shape))} <-> FRACTAL_NZ")
                    for b, shape in ((m * kk, (m, kk)), (kk * n, (kk, n)), (m * n, (m, n)))]
    soft = names[2] if grad and len(names) > 2 else names[1]
    kernels.append(Kernel(soft, "vector", 0.0, (3 if grad else 2) * scores, dtype, written=scores))
    return kernels


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
    written = 0.0
    if tensors:   # the output: the biggest input's size
        shape, dtype = max(tensors, key=lambda t: numel(t[0]))
        written = numel(shape) * dtype_bytes(dtype)
        moved += written
    return [Kernel(n, "vector", 0.0, moved, _float_dtype(op), written=written) for n in names]


def apply_passes(op, kernels: list[Kernel], passes: list) -> None:
    """Each kernel's bytes from its ``passes`` entry (npu_cost_model.yaml ``aten``): [reads, writes] of the
    operator's largest tensor, and optionally mask bits per element (written by a kernel that reads nothing
    else, the mask generator; read by the others)."""
    tensors = op_tensors(op)
    if not tensors:
        return
    shape, dtype = max(tensors, key=lambda t: numel(t[0]))
    size = numel(shape) * dtype_bytes(dtype)
    for kernel, spec in zip(kernels, passes, strict=False):
        reads, writes, bits = (list(spec) + [0, 0, 0])[:3]
        mask = numel(shape) * float(bits) / 8
        kernel.bytes = (float(reads) + float(writes)) * size + mask
        kernel.written = float(writes) * size + (mask if not reads else 0.0)


def _model_reduce(op, names) -> list[Kernel]:
    tensors = op_tensors(op)
    moved = tensor_bytes(*zip(*tensors, strict=True)) if tensors else 0.0
    return [Kernel(n, "vector", 0.0, moved, _float_dtype(op)) for n in names]


# lists a multi-tensor kernel reads and writes, by operator: (lists read, lists written); the others
# read every TensorList input and write the first (in place) or a new list like it (out of place)
_LIST_PASSES = {"_fused_adam_": (4, 3), "_fused_adamw_": (4, 3), "_fused_sgd_": (3, 2), "_foreach_norm": (1, 0)}


def _model_foreach(op, names) -> list[Kernel]:
    """A multi-tensor (foreach / fused optimizer) kernel: one launch over whole tensor lists."""
    lists = [lst for lst in tensor_lists(op) if lst[0]]
    name = base_name(op.name)
    if not lists:
        return [Kernel(n, "vector", 0.0, 0.0, _float_dtype(op)) for n in names]
    first = list_bytes(lists[0])
    if name in _LIST_PASSES:
        reads, writes = _LIST_PASSES[name]
        moved = first * (reads + writes)
    else:
        moved = sum(list_bytes(lst) for lst in lists) + first
        moved += sum(numel(s) * dtype_bytes(d) for s, d in op_tensors(op))
    if name == "_foreach_norm":   # one scalar out per tensor
        moved += len(lists[0][0]) * 4
    dtype = lists[0][1]
    return [Kernel(n, "vector", 0.0, moved, dtype, note=f"{len(lists[0][0])} tensors per list") for n in names]


def _model_concat(op, names) -> list[Kernel]:
    """cat/stack: reads every tensor of its list and writes them side by side (the list's element dtype is
    not recorded: the op's float dtype, else float32)."""
    lists = [lst for lst in tensor_lists(op) if lst[0]]
    if not lists:
        return model_elementwise(op, names)
    size = list_bytes(lists[0])
    return [Kernel(n, "vector", 0.0, 2.0 * size, lists[0][1], written=size) for n in names]


def _model_fill_copy(op, names) -> list[Kernel]:
    """select_backward / slice_backward (grad, input_sizes, ...): zero a tensor of the input's size, then
    copy the gradient into its slice: the first kernel writes the whole input size, the second reads and
    writes the gradient.  With one kernel name (new_zeros(self, size)): the zero fill of ``size`` alone."""
    tensors = op_tensors(op)
    if not tensors:
        return model_elementwise(op, names)
    grad, dtype = tensors[0]
    size = dtype_bytes(dtype)
    full = next((s for s in (op.scalars or [])[1:2] if isinstance(s, list) and s
                 and all(isinstance(d, int) for d in s)), grad)
    kernels = [Kernel(names[0], "vector", 0.0, numel(full) * size, dtype, written=numel(full) * size)]
    if len(names) > 1:
        kernels.append(Kernel(names[1], "vector", 0.0, 2.0 * numel(grad) * size, dtype, written=numel(grad) * size))
    return kernels


def launches_nothing(op, entry: dict) -> bool:
    """A call its ``free_when`` conditions (npu_cost_model.yaml ``aten``: [argument position, value]) make a
    no-op: ATen returns the input (dropout with p == 0 or outside training)."""
    scalars = op.scalars or []
    return any(len(scalars) > i and scalars[i] is not None and scalars[i] == value
               and isinstance(scalars[i], bool) == isinstance(value, bool)
               for i, value in entry.get("free_when") or [])


def _model_resize(op, names) -> list[Kernel]:
    """upsample_*: reads the input, writes the output (its size from output_size or the scale factors)."""
    tensors = op_tensors(op)
    if not tensors:
        return model_elementwise(op, names)
    shape, dtype = tensors[0]
    size = dtype_bytes(dtype)
    sc = op.scalars or []
    if base_name(op.name).endswith("_backward"):   # grad_output, output_size, input_size: writes the input grad
        grad_in = next((s for s in sc if isinstance(s, list) and len(s) == len(shape)
                        and all(isinstance(d, int) for d in s)), shape)
        return [Kernel(n, "vector", 0.0, (numel(shape) + numel(grad_in)) * size, dtype) for n in names]
    spatial = len(shape) - 2
    out_size = next((s for s in sc[1:] if isinstance(s, list) and len(s) == spatial
                     and all(isinstance(d, int) for d in s)), None)
    if out_size is None:
        scales = next((s for s in sc[1:] if isinstance(s, list) and len(s) == spatial), None)
        scales = scales or [v for v in sc[1:] if isinstance(v, float)][:spatial]
        if len(scales) == spatial:
            out_size = [int(d * float(f)) for d, f in zip(shape[2:], scales, strict=True)]
    out = [*shape[:2], *(out_size or shape[2:])]
    return [Kernel(n, "vector", 0.0, (numel(shape) + numel(out)) * size, dtype, shapes=[shape, out]) for n in names]


MODELS = {"conv": _model_conv, "conv_backward": _model_conv_backward, "matmul": _model_matmul,
          "attention": _model_attention, "pool": _model_pool, "pool_backward": _model_pool_backward,
          "elementwise": model_elementwise, "reduce": _model_reduce, "foreach": _model_foreach,
          "resize": _model_resize, "concat": _model_concat, "fill_copy": _model_fill_copy,
          "attention_math": _model_attention_math}


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


def nz_transdata(op, rule: dict | None, weights: frozenset | set = frozenset()) -> list[Kernel]:
    """ND <-> FRACTAL_NZ around a matmul (chips whose cube reads NZ only: the rule's families); each
    converted tensor is read and written once.  The second operand is not converted when it is a weight
    already cast to FRACTAL_NZ: any operand of an operator the rule lists in ``cast_once``, or one whose
    shape (either way round) is a 2-D parameter's (``weights``: a linear's backward reads it too)."""
    dims = matmul_dims(op) if rule and base_name(op.name) in MATMULS else None
    if dims is None:
        return []
    batch, m, k, n = dims
    size = dtype_bytes(_float_dtype(op))
    moved = [batch * m * k * size, k * n * size, batch * m * n * size]   # a, b in; the result back to ND
    shapes = [[batch * m, k], [k, n], [batch * m, n]]
    operands = [tuple(shape) for shape, _ in op_tensors(op)]
    if base_name(op.name) in ("addmm", "baddbmm"):   # the bias comes first
        operands = operands[1:]
    second = operands[1] if len(operands) > 1 else ()
    result = (batch * m, n)   # a weight-gradient product yields a parameter's shape: its operands are activations
    if base_name(op.name) in (rule or {}).get("cast_once", []) or \
            (len(second) == 2 and (second in weights or second[::-1] in weights)
             and result not in weights and result[::-1] not in weights):   # already FRACTAL_NZ
        moved, shapes = [moved[0], moved[2]], [shapes[0], shapes[2]]
    return [Kernel("TransData", "vector", 0.0, 2.0 * b, _float_dtype(op), inserted=True,
                   note=f"{'x'.join(map(str, shape))} <-> FRACTAL_NZ")
            for b, shape in zip(moved, shapes, strict=True)]


MATMULS = ("mm", "addmm", "matmul", "linear", "bmm", "baddbmm")


# --- rules that explain why a signature is slow ---

# torch's ScalarType codes, as the profiler records a dtype argument (``_to_copy(x, dtype=6)``)
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64",
                9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16"}


def output_dtype(op) -> str | None:
    """The dtype a cast writes (``_to_copy``'s dtype argument), None when the op does not say."""
    if base_name(op.name) not in ("_to_copy", "to", "type_as"):
        return None
    code = (op.scalars or [None, None])[1] if len(op.scalars or []) > 1 else None
    return SCALAR_TYPES.get(code) if isinstance(code, int) and not isinstance(code, bool) else None


def aicpu_reason(op, rules: dict, kernels: list[Kernel] | None = None) -> str | None:
    """Why ``op`` runs on AI CPU, or None.  Per kernel type (the advisor's DataTypeChecker lists: the
    dtypes each op type takes on the AI Core, inputs and outputs, per CANN version), then the ATen
    operators whose kernel is a cube kernel (fp16/bf16/fp32 only), then the defaults."""
    name = base_name(op.name)
    special = (rules.get("ops") or {}).get(name)
    odd = sorted({d for _, d in op_tensors(op) if not d.startswith(("float", "bfloat"))})
    if special:
        return f"{special.get('why', 'runs on AI CPU')}" + (f" (inputs {', '.join(odd)})" if odd else "")
    table = (rules.get("aicore_dtypes") or {}).get(str(rules.get("cann")), {})
    ins = sorted({d for _, d in op_tensors(op)})
    out = output_dtype(op)
    by_op = (table.get("ops") or {}).get(name)
    if by_op:
        bad = [d for d in ins if d not in by_op]
        return (f"dtype {', '.join(bad)} is not an AI Core dtype of {name} (CANN {rules.get('cann')}): runs on AI CPU"
                if bad else None)
    by_kernel = table.get("kernels") or {}
    types = [k.type for k in kernels] if kernels is not None else \
        list(((cost_model().get("aten") or {}).get(name) or {}).get("kernels") or [""])
    for ktype in types or [""]:
        allowed = by_kernel.get(ktype) or table.get("default") or []
        if not allowed:
            continue
        extra = (table.get("measured_aicore") or {}).get(ktype) or {}
        bad_in = [d for d in ins if d not in allowed and d not in (extra.get("input") or [])]
        bad_out = [out] if out and out not in allowed and out not in (extra.get("output") or []) else []
        if bad_in or bad_out:
            what = ", ".join(bad_in + [f"{d} (output)" for d in bad_out])
            return (f"dtype {what} is not an AI Core dtype of {ktype or name} (CANN {rules.get('cann')}, "
                    "advisor DataTypeChecker): runs on AI CPU")
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
            # a decode step's one query row (S = 1) runs the incremental kernel: not an unaligned sequence
            bad = [f"{axis}={v}" for axis, v in (("D", d), ("S", s)) if v % int(rule["multiple"])
                   and not (axis == "S" and v == 1)]
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
    stream = [c for c in stream if c.step == step]
    if any(c.order for c in stream):   # the step's true order (OpCall.order): folded records recur in it
        stream = [c for _, c in sorted(((i, c) for c in stream for i in c.order), key=lambda ic: ic[0])]
    else:   # a trace's calls, or a capture written before the order was kept
        stream = sorted(stream, key=lambda c: (c.start_us, c.seq_nr))
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
                                           "min_cann": pattern.get("min_cann"), "sites": []})
            for j in range(i, end):   # the lines (the user's and a library's) of the matched calls
                site = [stream[j].source, stream[j].library]
                if site not in entry["sites"]:
                    entry["sites"].append(site)
            entry["count"] += 1 if stream[i].order else max(int(getattr(stream[i], "count", 1) or 1), 1)
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
