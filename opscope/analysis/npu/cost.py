"""The time of one NPU kernel from its type, shapes and dtypes: a calibrated roofline.

One function prices every kernel, whether it comes from a CPU scan (an ATen operator
turned into the kernels it becomes on the NPU) or from a real profile's
``kernel_details.csv`` (to check and calibrate the model), so the two can be compared.
The figures (chip peaks, per-kernel achieved fraction, floors) are data:
``support_matrix/npu_chips.yaml`` and ``npu_cost_model.yaml``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from opscope import knowledge


@dataclass
class Kernel:
    """One NPU kernel launch (``count`` identical ones): what it computes and moves."""
    type: str
    unit: str = "vector"        # cube | fa | vector | aicpu | dma | comm
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "float32"      # the compute dtype (cube peak per dtype)
    count: float = 1.0
    inserted: bool = False      # TransData/Cast the NPU adds, not the script
    written: float = 0.0        # of ``bytes``, those written (cube kernels write faster than they stream in)
    warm: float = 0.0           # share of launches re-run on the tensors the launch before touched (``l2_share``)
    note: str = ""
    shapes: list = field(default_factory=list)


# The shared real profiles the `derived` figures of npu_cost_model.yaml were fitted on (its header's
# `source:` keys): kernel_details.csv per kernel type, the AlexNet run's operator tables and trace for
# the host, DDP and TransData figures.  `path` ends the rank folder, `job` names the run it belongs to.
# bench/npu_estimate_accuracy.py refits without each one and predicts it (leave-one-out).
FITTED_PROFILES = {
    "alexnet_l1": {"path": "alexnet_ddp_2rank/text/level1/rank0_ascend_pt", "job": "alexnet_ddp_2rank",
                   "chip": "Ascend910B2", "what": "the shared AlexNet b32 fp32 DDP run (rank 0, level 1, Ascend910B2)"},
    "llm_r0": {"path": "llm_megatron_4rank_level2/rank_0_ascend_pt", "job": "llm_megatron_4rank_level2",
               "chip": "Ascend910B3", "what": "the shared Megatron LLM bf16 run (rank 0, Ascend910B3)"},
}


def fitted_on(keys=None, held_out: str = "LLM rank 2") -> str:
    """One line: the profiles the figures were fitted on (default: the shipped fit) and what was held out."""
    keys = list(FITTED_PROFILES) if keys is None else list(keys)
    names = [FITTED_PROFILES[k]["what"] for k in keys if k in FITTED_PROFILES]
    return (f"figures fitted on {' and '.join(names) if names else 'no profile (priors only)'}"
            + (f"; held out: {held_out}" if held_out else ""))


def cost_model() -> dict:
    """npu_cost_model.yaml; its ``calibration`` lines start with what the figures were fitted on."""
    model = knowledge.load("npu_cost_model.yaml")
    calibration = model.get("calibration")
    if not isinstance(calibration, dict) or "fitted_on" not in calibration:
        model["calibration"] = {"fitted_on": fitted_on(), **(calibration if isinstance(calibration, dict) else {})}
    return model


def chips() -> dict:
    return knowledge.load("npu_chips.yaml")


def chip_names() -> list[str]:
    return list((chips().get("chips") or {}).keys())


def resolve_chip(name: str | None) -> tuple[str, dict]:
    """(canonical name, figures) of a chip; ``910b3``/``Ascend910B3`` both work; unknown -> UserError."""
    table = chips().get("chips") or {}
    wanted = name or chips().get("default") or next(iter(table))
    for key, figures in table.items():
        if key.lower() in (wanted.lower(), "ascend" + wanted.lower()):
            return key, figures
    from opscope.errors import UserError
    raise UserError(f"unknown chip {name!r}; known: {', '.join(table)}")


@lru_cache(maxsize=256)
def dtype_name(raw: str) -> str:
    """A profiler/torch dtype spelling (``FLOAT``, ``DT_BF16``, ``c10::Half``, ``long int``) -> torch name."""
    aliases = cost_model().get("dtype_aliases") or {}
    key = (raw or "").strip()
    return aliases.get(key, aliases.get(key.lower(), key.lower()))


def dtype_bytes(raw: str) -> int:
    return int((cost_model().get("dtype_bytes") or {}).get(dtype_name(raw), 4))


def numel(shape) -> int:
    if not isinstance(shape, (list, tuple)):
        return 1
    n = 1
    for d in shape:
        n *= int(d) if isinstance(d, (int, float)) else 1
    return n


def tensor_bytes(shapes, dtypes) -> float:
    """Bytes of tensors (shapes and their dtypes side by side); non-tensors count 0."""
    total = 0.0
    for i, shape in enumerate(shapes or []):
        if not isinstance(shape, (list, tuple)) or (shape and not isinstance(shape[0], (int, float))):
            continue
        dtype = dtypes[i] if i < len(dtypes or []) else "float32"
        if not isinstance(dtype, str) or not dtype:
            continue
        total += numel(shape) * dtype_bytes(dtype)
    return total


def kernel_params(kernel_type: str) -> dict:
    """The cost model's entry for a kernel type (``default_vector`` when it has none)."""
    model = cost_model()
    table = model.get("kernels") or {}
    return table.get(kernel_type) or table.get("default_vector") or {}


def _pricing_inputs(kernel: Kernel, chip: dict) -> tuple[dict, dict, str, float, float, float]:
    """(cost model, the kernel type's entry, unit, reference HBM GB/s, this chip's HBM GB/s, floor in us)."""
    model = cost_model()
    params = kernel_params(kernel.type)
    unit = kernel.unit or params.get("unit", "vector")
    ref_hbm = float((model.get("reference") or {}).get("hbm_gbps", 1600))
    hbm = float(chip.get("hbm_gbps") or ref_hbm)
    floor = float(params.get("floor_us", (model.get("floors") or {}).get(unit, 2.0)))
    return model, params, unit, ref_hbm, hbm, floor


_CUBE_KEYS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def cube_run(kernel: Kernel, chip: dict, params: dict | None = None) -> tuple[str, float, float]:
    """(the dtype the cube computes ``kernel`` in on ``chip``, that dtype's peak TFLOPS, the kernel type's
    efficiency at it).  An fp32 matmul or convolution runs as the chip family's default makes it
    (npu_chips.yaml ``families``): fp16 on a 910A (``fp32_cube_runs_as``: allow_fp32_to_fp16), HF32 for
    convolutions on a 910B (``hf32_defaults``), fp32 otherwise."""
    params = kernel_params(kernel.type) if params is None else params
    key = _CUBE_KEYS.get(dtype_name(kernel.dtype), "fp16")
    if key == "fp32":
        family = (chips().get("families") or {}).get(chip.get("family", "")) or {}
        kind = "conv" if str(params.get("flops", "")).startswith("conv") else "matmul"
        if family.get("fp32_cube_runs_as") == "float16":
            key = "fp16"
        elif (family.get("hf32_defaults") or {}).get(kind):
            key = "hf32"
    peaks = chip.get("cube_tflops") or {}
    peak = float(peaks.get(key) or peaks.get("fp16") or 100.0)
    eff = params.get("efficiency", 0.6)
    if isinstance(eff, dict):
        eff = eff.get(key, eff.get("default", 0.6))
    return key, peak, float(eff or 0.6)


def kernel_time_us(kernel: Kernel, chip: dict, factors: dict | None = None) -> float:
    """Predicted device time of ``kernel.count`` launches of one kernel, in microseconds.

    cube/fa: floor + max(FLOPs / (peak[dtype] x efficiency), bytes / HBM);  vector: floor +
    bytes / (achieved bandwidth of that kernel type, scaled to this chip's HBM);  AI CPU:
    its own floor and a far lower bandwidth.  ``factors`` (from ``opscope calibrate``)
    scale each unit's result.
    """
    model, params, unit, ref_hbm, hbm, floor = _pricing_inputs(kernel, chip)
    if unit in ("cube", "fa"):
        _, peak, eff = cube_run(kernel, chip, params)
        compute = kernel.flops / (peak * 1e12 * eff) * 1e6 if kernel.flops else 0.0
        read = max(kernel.bytes - kernel.written, 0.0)
        memory = (read / (hbm * 1e9 * float(params.get("memory_efficiency", 0.6)))
                  + kernel.written / (hbm * 1e9 * float(params.get("write_efficiency", 1.0)))) * 1e6
        one = floor + max(compute, memory)
    elif unit == "aicpu":
        aicpu = model.get("aicpu") or {}
        one = float(aicpu.get("floor_us", 30)) + kernel.bytes / (float(aicpu.get("gbps", 1.0)) * 1e9) * 1e6
    else:
        rate = vector_rate(kernel, chip)[0] * 1e9
        read = kernel.bytes - min(kernel.written, kernel.bytes)
        share, speedup = l2_share(kernel, chip)
        one = floor + (kernel.bytes - share * read * (1.0 - 1.0 / speedup)) / rate * 1e6
    if factors:
        one *= float(factors.get(unit, 1.0))
    return one * kernel.count


def _fits_l2(kernel: Kernel, chip: dict) -> bool:
    l2_mib = float(chip.get("l2_mib") or 0)
    return bool(l2_mib) and kernel.bytes <= l2_mib * 2 ** 20


def vector_rate(kernel: Kernel, chip: dict) -> tuple[float, bool]:
    """(GB/s of a vector kernel on ``chip``, whether it was capped): its type's achieved rate scaled to the
    chip's HBM, at most the chip's HBM bandwidth for a kernel larger than its L2 (or on a chip with no L2
    figure): a rate above HBM (Relu, ReluGrad) was reached on data held in L2 (npu_cost_model.yaml ``l2``)."""
    model, params, _, ref_hbm, hbm, _ = _pricing_inputs(kernel, chip)
    gbps = float(params.get("gbps", (model.get("kernels") or {}).get("default_vector", {}).get("gbps", 600)))
    rate = gbps * hbm / ref_hbm
    if rate > hbm and not _fits_l2(kernel, chip):
        return hbm, True
    return rate, False


def l2_share(kernel: Kernel, chip: dict) -> tuple[float, float]:
    """(share of launches whose reads come from L2, the L2 read speedup): a vector kernel re-run on the
    tensors the launch before touched (``kernel.warm``) whose bytes fit the chip's L2 (npu_cost_model.yaml
    ``l2``); (0, 1) on a chip with no L2 figure or for a kernel larger than its L2."""
    speedup = float((cost_model().get("l2") or {}).get("read_speedup", 1.0))
    if kernel.warm <= 0 or kernel.unit not in ("vector", "") or not _fits_l2(kernel, chip) or speedup <= 1.0 \
            or kernel.written <= 0:   # how its bytes split into reads and writes is not known
        return 0.0, 1.0
    if vector_rate(kernel, chip)[0] > _pricing_inputs(kernel, chip)[4]:   # its rate was fitted on data in L2
        return 0.0, 1.0
    return min(kernel.warm, 1.0), speedup


def mark_repeats(kernels: list[Kernel]) -> list[Kernel]:
    """Profile kernels in launch order: each that repeats the one before (same type, shapes and bytes: the
    same operator re-run, as a loop over it does) is ``warm`` (its inputs are in L2 when they fit)."""
    for before, kernel in zip(kernels, kernels[1:], strict=False):
        if (kernel.type, kernel.bytes, str(kernel.shapes)) == (before.type, before.bytes, str(before.shapes)):
            kernel.warm = 1.0
    return kernels


def pricing_rule(kernel: Kernel, chip: dict) -> str:
    """The rule ``kernel_time_us`` priced ``kernel`` by, in words (for the estimate's report row)."""
    model, params, unit, ref_hbm, hbm, floor = _pricing_inputs(kernel, chip)
    if unit in ("cube", "fa"):
        run, peak, eff = cube_run(kernel, chip, params)
        given = _CUBE_KEYS.get(dtype_name(kernel.dtype), "fp16")
        how = f"{run}" if run == given else f"{run} (the chip's default for {given})"
        return (f"{kernel.type}: {unit} {kernel.flops / 1e9:,.2f} GFLOP at {how} {peak:g} TFLOPS x {eff:.2f}, "
                f"or {kernel.bytes / 1e6:,.2f} MB at HBM if slower, + {floor:g} us")
    if unit == "aicpu":
        aicpu = model.get("aicpu") or {}
        return f"{kernel.type}: AI CPU {kernel.bytes / 1e6:,.2f} MB at {aicpu.get('gbps', 1.0)} GB/s + {aicpu.get('floor_us', 30)} us"
    own = "" if kernel.type in (model.get("kernels") or {}) else " (the default vector rate: no entry of its own)"
    rate, capped = vector_rate(kernel, chip)
    if capped:
        own += " (the chip's HBM: its own rate was reached on data in L2, and this kernel does not fit there)"
    share, speedup = l2_share(kernel, chip)
    l2 = (f"; {share:.0%} of launches re-run on tensors in the {chip.get('l2_mib'):g} MiB L2: reads at {speedup:g}x"
          if share else "")
    return (f"{kernel.type}: vector {kernel.bytes / 1e6:,.2f} MB at {rate:,.0f} GB/s{own} "
            f"+ {floor:g} us{l2}")


def unit_of(kernel_type: str, core: str = "") -> str:
    """cube / fa / vector / aicpu / comm for a profile kernel (its type's entry, else its core)."""
    params = (cost_model().get("kernels") or {}).get(kernel_type)
    if params and params.get("unit"):
        return params["unit"]
    core = core.upper()
    if core == "AI_CPU":
        return "aicpu"
    if core in ("HCCL", "COMMUNICATION") or kernel_type.startswith("hcom_"):
        return "comm"
    if core == "AI_CORE":
        return "cube"
    return "vector"


def row_flops(kind: str, ins: list, outs: list) -> float:
    """FLOPs of a profile kernel from its shapes (NC1HWC0 / FRACTAL_Z for convolutions)."""
    try:
        if kind == "matmul":       # a [.., M, K] (or transposed), b -> out [.., M, N]
            out = outs[0]
            rows = numel(out[:-1]) if len(out) > 1 else 1
            return 2.0 * numel(out) * (numel(ins[0]) / max(rows, 1))
        if kind == "conv":          # x(5HD), w(FZ) -> y(5HD)
            w = ins[1]
            return 2.0 * numel(outs[0]) * w[0] * w[-1]
        if kind == "conv_bwd_input":   # sizes, w(FZ), dy(5HD)
            w = ins[1]
            return 2.0 * numel(ins[2]) * w[0] * w[-1]
        if kind == "conv_bwd_filter":  # x(5HD), sizes, dy(5HD) -> dw(FZ)
            w = outs[0]
            return 2.0 * numel(ins[2]) * w[0] * w[-1]
        if kind in ("attention", "attention_grad"):
            q, k = ins[0], ins[1]
            s_kv = k[0] if len(k) == 3 and k[0] >= k[1] else (k[1] if len(k) == 3 else k[-2])
            mask_at = 6 if kind == "attention" else 4   # atten_mask's position in the kernel's inputs
            mask = len(ins) > mask_at and bool(ins[mask_at])
            flops = 4.0 * numel(q) * s_kv * (0.5 if mask else 1.0)
            return flops * (2.5 if kind == "attention_grad" else 1.0)
    except (IndexError, TypeError, ZeroDivisionError):
        return 0.0
    return 0.0


def kernel_from_row(row) -> Kernel:
    """A Kernel (flops, bytes, dtype) from a ``KernelRow`` of kernel_details.csv."""
    params = (cost_model().get("kernels") or {}).get(row.type) or {}
    unit = unit_of(row.type, row.core)
    kind = params.get("flops", "")
    flops = row_flops(kind, row.input_shapes, row.output_shapes) if kind else 0.0
    if kind == "matmul" and unaligned_inner_axes(row.input_shapes):
        flops *= float((cost_model().get("alignment") or {}).get("matmul", {}).get("slowdown", 1.0))
    moved = tensor_bytes(row.input_shapes, row.input_dtypes) + tensor_bytes(row.output_shapes, row.output_dtypes)
    dtype = next((d for d in row.input_dtypes if dtype_name(d).startswith(("float", "bfloat"))), "float32")
    return Kernel(type=row.type, unit=unit, flops=flops, bytes=moved, dtype=dtype_name(dtype),
                  shapes=row.input_shapes, written=tensor_bytes(row.output_shapes, row.output_dtypes))


def profile_kernels(rows) -> list[Kernel]:
    """The Kernels of a profile's ``KernelRow``s in launch order (kernel_details.csv's), repeats marked."""
    return mark_repeats([kernel_from_row(row) for row in rows])


def unaligned_inner_axes(shapes) -> bool:
    """The advisor's cube affinity check on ND operands: both inner (last) axes % 256 == 0."""
    multiple = int((cost_model().get("alignment") or {}).get("matmul", {}).get("multiple", 256))
    two_d = [s for s in shapes[:2] if isinstance(s, list) and len(s) == 2]
    return len(two_d) == 2 and any(s[-1] % multiple for s in two_d)


def log2_ratio(predicted: float, measured: float) -> float:
    return math.log2(max(predicted, 1e-9) / max(measured, 1e-9))


CALIBRATION_FILE = "opscope-calibration.json"


def fit_calibration(kernel_csvs, chip_name: str | None) -> dict:
    """Per kernel unit, the factor (time-weighted: measured / estimated kernel time) that fits the
    model to real kernels, with the median |log2 ratio| before and after."""
    import statistics

    from opscope.parsers.ascend_kernels import read_kernel_details
    name, chip = resolve_chip(chip_name)
    pairs: dict[str, list] = {}
    for path in kernel_csvs:
        rows = read_kernel_details(path)
        for row, kernel in zip(rows, profile_kernels(rows), strict=True):
            if kernel.unit == "comm" or row.duration_us <= 0:
                continue
            pairs.setdefault(kernel.unit, []).append((kernel_time_us(kernel, chip), row.duration_us))
    units = {}
    for unit, items in pairs.items():
        factor = sum(m for _, m in items) / max(sum(p for p, _ in items), 1e-9)
        units[unit] = {"factor": round(factor, 4), "kernels": len(items),
                       "median_abs_log2_before": round(statistics.median(abs(log2_ratio(p, m)) for p, m in items), 3),
                       "median_abs_log2_after": round(statistics.median(abs(log2_ratio(p * factor, m))
                                                                        for p, m in items), 3)}
    return {"chip": name, "units": units, "profiles": [str(p) for p in kernel_csvs]}


def merge_calibration(path, fitted: dict):
    """Write ``fitted`` into the calibration file at ``path`` (other chips' entries kept)."""
    import json
    from pathlib import Path

    from opscope.atomic import write_atomic
    path = Path(path)
    data = load_calibration(path) or {"version": 1, "chips": {}}
    data.setdefault("chips", {})[fitted["chip"]] = fitted
    write_atomic(path, json.dumps(data, indent=1) + "\n")
    return path


def load_calibration(path) -> dict | None:
    """A calibration file (``opscope calibrate``), or None when absent; a broken one is an InputError."""
    import json
    from pathlib import Path

    from opscope.errors import InputError
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(path, f"is not a calibration file ({exc})", fix="re-run `opscope calibrate` or delete it") \
            from None
    if not isinstance(data, dict) or not isinstance(data.get("chips"), dict):
        raise InputError(path, "is not a calibration file (no 'chips')", fix="re-run `opscope calibrate` or delete it")
    return data


def calibration_factors(path, chip_name: str | None) -> tuple[dict | None, str | None]:
    """(unit -> factor, the file) for a chip from a calibration file; (None, None) without one."""
    data = load_calibration(path) if path else None
    if not data:
        return None, None
    name, _ = resolve_chip(chip_name)
    entry = (data.get("chips") or {}).get(name)
    if not entry:
        return None, None
    factors = {unit: float(v.get("factor", 1.0)) for unit, v in (entry.get("units") or {}).items()}
    from pathlib import PurePath
    profiles = [PurePath(str(p)) for p in entry.get("profiles") or [] if isinstance(p, str)]
    names = [(p.parent.parent if p.parent.name == "ASCEND_PROFILER_OUTPUT" else p.parent).name or str(p)
             for p in profiles]
    return factors, (f"{path}, fitted on {', '.join(dict.fromkeys(names))}" if names else str(path))
