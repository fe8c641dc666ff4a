"""Run one captured signature three ways and judge the device against the CPU.

* device:    the op on the device under test, in the captured dtypes
* reference: the op on the CPU, in the captured dtypes (a trusted low-precision result)
* oracle:    the op on the CPU with every floating input in float64 (the golden values)

Same input values for all three (built once by ``opscope.replay.inputs``).  On ``--device
cpu`` the device run *is* the reference run, so comparing them proves nothing and is never
reported as a pass: each floating-point signature is instead ``measured`` - the CPU's own
kernel in the captured dtype (fp16/bf16 as the script used them under autocast) against the
float64 oracle, labelled as the CPU's numerics, not NPU evidence - and the rest is skipped.
What a CPU can prove before porting, that a suggested substitute computes what the original
op does, runs on every device (``opscope.replay.substitutes``).
"""
from __future__ import annotations

import datetime as _dt
import time
import traceback
from dataclasses import dataclass, field

from opscope.errors import UserError
from opscope.replay.inputs import (
    SCALAR_TYPE_ARGS,
    DumpedTensors,
    NotReplayable,
    SyntheticTensors,
    build_call,
    load_standards,
    short_name,
)
from opscope.replay.outputs import flatten_outputs

FLOAT_CODES = {5, 6, 7, 15}   # c10 ScalarType: Half, Float, Double, BFloat16
DOUBLE_CODE = 7


def resolve_device(name: str):
    """torch.device for ``npu`` / ``cuda`` / ``cpu``; a UserError when it is not usable here."""
    import torch
    name = (name or "").lower()
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA device is available here; use --device cpu "
                            "or run verify on a GPU machine")
        return torch.device("cuda")
    if name == "npu":
        try:
            import torch_npu  # noqa: F401
        except Exception as exc:  # torch_npu missing or CANN not set up
            raise UserError(f"--device npu: torch_npu is not importable ({type(exc).__name__}); install "
                            "torch_npu with CANN on an Ascend machine, or use --device cpu") from None
        if not torch.npu.is_available():   # type: ignore[attr-defined]  # pragma: no cover - needs Ascend hardware
            raise UserError("--device npu: torch_npu imported but no NPU is visible; check npu-smi "
                            "and ASCEND_RT_VISIBLE_DEVICES")
        return torch.device("npu")
    raise UserError(f"unknown --device {name!r}: use npu, cuda or cpu")


# ------------------------------------------------------------------ moving calls

def _map(value, fn):
    import torch
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


def to_device(call, device):
    """Args/kwargs on ``device``; 0-dim float64 tensors (wrapped Python numbers) stay host scalars."""
    import torch

    def move(t):
        if t.dim() == 0 and t.dtype == torch.float64 and device.type != "cpu":
            return t.clone()
        return t.to(device, copy=True)

    args = _map(call.args, move)
    kwargs = {k: _map(v, move) for k, v in call.kwargs.items()}
    for i, arg in enumerate(call.schema.arguments):  # factory/transfer ops: make them on the device
        if "Device" in str(arg.type):
            if arg.name in kwargs:
                kwargs[arg.name] = device
            elif i < len(args) and args[i] is not None:
                args[i] = device
    return args, kwargs


def to_oracle(call):
    """Args/kwargs with floating tensors and float ScalarType arguments promoted to float64."""
    import torch

    def up(t):
        return t.to(torch.float64) if t.dtype.is_floating_point else t.clone()

    args = _map(call.args, up)
    kwargs = {k: _map(v, up) for k, v in call.kwargs.items()}
    names = [a.name for a in call.schema.arguments]
    for i, value in enumerate(args):
        if i < len(names) and names[i] in SCALAR_TYPE_ARGS and value in FLOAT_CODES:
            args[i] = DOUBLE_CODE
    for key in SCALAR_TYPE_ARGS:
        if kwargs.get(key) in FLOAT_CODES:
            kwargs[key] = DOUBLE_CODE
    return args, kwargs


def cpu_copy(call):
    return _map(call.args, lambda t: t.clone()), {k: _map(v, lambda t: t.clone()) for k, v in call.kwargs.items()}


def run_on_device(call, device):
    """Run the call on ``device`` and bring the outputs back to the CPU.  (Tests perturb this.)"""
    args, kwargs = to_device(call, device)
    outputs = flatten_outputs(call.packet()(*args, **kwargs))
    if device.type != "cpu":
        import torch
        getattr(torch, device.type).synchronize()
    return [o.detach().cpu() if o is not None else None for o in outputs]


def run_reference(call):
    args, kwargs = cpu_copy(call)
    return [o.detach() if o is not None else None for o in flatten_outputs(call.packet()(*args, **kwargs))]


def run_oracle(call):
    args, kwargs = to_oracle(call)
    return [o.detach() if o is not None else None for o in flatten_outputs(call.packet()(*args, **kwargs))]


def run_magnitude(call):
    """The float64 oracle on the absolute values of every floating input and numeric scalar: for a
    matmul or convolution, sum|a*b| per output, the magnitude its accumulation rounds on."""
    import torch
    args, kwargs = to_oracle(call)

    def positive(value):
        if isinstance(value, torch.Tensor):
            return value.abs() if value.dtype.is_floating_point else value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return abs(value)
        return value

    args = [positive(v) for v in args]
    kwargs = {k: positive(v) for k, v in kwargs.items()}
    return [o.detach() if o is not None else None for o in flatten_outputs(call.packet()(*args, **kwargs))]


def reduced_fp32(device) -> frozenset[str]:
    """The cube families (``conv``, ``matmul``) whose float32 this process runs on ``device`` with a
    10-bit mantissa: TF32 on CUDA (cuDNN convolutions by default), HF32 on Ascend (convolutions by
    default).  Read from torch's settings here: the script's own settings are not recorded."""
    import warnings

    import torch
    families = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the legacy flags are the effective settings; the new API may warn
        try:
            if device.type == "cuda":
                if torch.backends.cudnn.allow_tf32:
                    families.add("conv")
                if torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest":
                    families.add("matmul")
            elif device.type == "npu":   # pragma: no cover - needs torch_npu
                npu = getattr(torch, "npu", None)
                if getattr(getattr(npu, "conv", None), "allow_hf32", False):
                    families.add("conv")
                if getattr(getattr(npu, "matmul", None), "allow_hf32", False):
                    families.add("matmul")
        except Exception:   # a build without these settings: full float32
            return frozenset()
    return frozenset(families)


def _magnitude(base: str, call, reference: list, standards: dict, reduced: bool = False):
    """``run_magnitude`` for a low-precision cube op (``standards.cube``), else None."""
    from opscope.analysis.verify import is_cube
    if not any(r is not None and is_cube(base, r.dtype, standards, reduced) for r in reference):
        return None
    try:
        return run_magnitude(call)
    except Exception:  # no float64 kernel: judged as any other op
        return None


# ------------------------------------------------------------------ one signature

@dataclass
class SignatureResult:
    op: str
    overload: str | None
    input_shapes: list
    dtypes: list
    outcome: str                      # pass | warn | fail | error | skipped
    metrics: dict = field(default_factory=dict)
    standard: str | None = None
    message: str = ""
    predicted_verdict: str | None = None
    disagreement: str | None = None
    seconds: float = 0.0
    msprobe: str | None = None        # the outcome as msprobe names it (pass / warning / error)

    def to_dict(self) -> dict:
        from opscope.model import json_safe
        return json_safe(self)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _cpu_refusal(op, exc) -> str:
    floats = {d for d in op.dtypes if d in ("float", "double", "c10::Half", "c10::BFloat16")}
    if len(floats) > 1:
        return ("recorded under autocast with mixed float dtypes (autocast casts before the kernel); "
                "the ops it dispatches to are verified as their own signatures")
    text = str(exc)
    if isinstance(exc, NotImplementedError) and "Could not run" in text and "'CPU' backend" in text:
        return ("a backend's own kernel with no CPU implementation (e.g. cuDNN's): there is no CPU reference "
                "to judge it by")
    return f"inputs not accepted by the CPU op either ({_one_line(exc)})"


CPU_SELF = ("on --device cpu the device and the reference are the same CPU computation: nothing to compare "
            "(run verify on npu/cuda to judge device numerics)")


def _measure_cpu(result, reference: list, oracle: list | None, standards: dict):
    """--device cpu: the CPU kernel in the captured dtype against float64, measured, never judged."""
    from opscope.analysis.verify import accuracy_reached, dtype_thresholds, error_stats, measure_tensor
    pairs = [(r, o) for r, o in zip(reference, oracle or [], strict=False) if r is not None and o is not None
             and r.dtype.is_floating_point and tuple(r.shape) == tuple(o.shape)]
    if not pairs:
        result.outcome, result.message = "skipped", CPU_SELF + ("; no float64 oracle for this op" if oracle is None
                                                                 else "; no floating-point output")
        return result
    ref, orc = pairs[0]
    dtype = str(ref.dtype).replace("torch.", "")
    result.outcome, result.standard = "measured", "cpu-numerics"
    result.metrics = {**measure_tensor(ref, orc, standards), "dtype": dtype,
                      "low_precision": dtype in ("float16", "bfloat16")}
    stats = error_stats(ref, orc, dtype_thresholds(ref.dtype, standards))
    note = "" if accuracy_reached(stats, standards["accuracy_reached"]) else \
        " - does not reach accuracy itself (cosine/MaxAbsErr rule)"
    result.message = (f"the CPU's own kernel ({dtype} output) vs float64: max rel err {stats['max_rel_err']:.3g}, cosine "
                      f"{stats['cosine']:.6f}{note} (CPU numerics, not NPU evidence)")
    return result


def verify_signature(op, device, source=None, standards: dict | None = None,
                     max_elements: int | None = None, fp32_reduced: frozenset[str] = frozenset()) -> SignatureResult:
    """Replay one captured signature on ``device`` and judge it against the CPU.

    ``fp32_reduced``: the cube families the device runs in TF32/HF32 (``reduced_fp32``)."""
    import torch

    from opscope.analysis.verify import cube_family, judge_outputs, msprobe_outcome, prediction_disagreement
    standards = standards or load_standards()
    started = time.perf_counter()
    result = SignatureResult(op=op.name, overload=op.overload, input_shapes=op.input_shapes, dtypes=op.dtypes,
                             outcome="skipped", predicted_verdict=getattr(op, "verdict", None))
    try:
        if getattr(op, "on_device", True) is False:
            raise NotReplayable("host-only op in this script (set-up or data loading on CPU tensors); "
                                "it stays on the CPU after porting")
        call = build_call(op, source=source, standards=standards, max_elements=max_elements)
        if op.overload is None:
            result.overload = call.schema.overload_name or "default"
        with torch.no_grad():
            try:
                reference = run_reference(call)
            except Exception as exc:  # the op refuses our inputs on the CPU too: not a device problem
                raise NotReplayable(_cpu_refusal(op, exc)) from None
            try:
                oracle = run_oracle(call)
            except Exception:  # no float64 kernel (or dtype-bound args): judge against the CPU only
                oracle = None
            if device.type == "cpu":
                return _measure_cpu(result, reference, oracle, standards)
            try:
                device_out = run_on_device(call, device)
            except Exception as exc:
                result.outcome = "error"
                result.message = _one_line(exc)
                return result
        _, base = short_name(op.name)
        reduced = cube_family(base) in fp32_reduced
        with torch.no_grad():
            scale = _magnitude(base, call, reference, standards, reduced) if oracle is not None else None
        judged = judge_outputs(base, device_out, reference, oracle, standards, scale=scale, reduced_fp32=reduced)
        result.outcome, result.metrics, result.standard, result.message = (
            judged["outcome"], judged["metrics"], judged["standard"], judged["message"])
        result.msprobe = msprobe_outcome(result.outcome, standards)
    except NotReplayable as why:
        result.outcome, result.message = "skipped", str(why)
    except Exception as exc:  # a bug in the replay itself must not stop the other signatures
        result.outcome = "skipped"
        result.message = f"opscope could not replay this op: {_one_line(exc)}"
        result.metrics = {"traceback": traceback.format_exc(limit=3)[-800:]}
    finally:
        result.seconds = round(time.perf_counter() - started, 4)
        result.disagreement = prediction_disagreement(result.outcome, result.predicted_verdict, device.type)
    return result


def _fp32_note(families: frozenset[str]) -> str:
    if not families:
        return ""
    names = " and ".join({"conv": "convolutions", "matmul": "matmuls"}[f] for f in sorted(families))
    return (f"; float32 {names} judged at TF32/HF32 precision (the device runs them with a 10-bit mantissa "
            "by this process's settings)")


def verify_operators(operators, device_name: str, run_dir=None, seed: int = 0, progress=None,
                     max_elements: int | None = 50_000_000, only=None, substitutes: dict | None = None) -> dict:
    """Verify every signature; returns the ``verification`` dict stored in scan.json.

    ``progress(done, total, result)`` is called after each signature; ``only`` filters by
    op name substring.
    """
    from opscope.analysis.verify import summarise
    device = resolve_device(device_name)
    standards = load_standards()
    synthetic = SyntheticTensors(seed)
    dumped = DumpedTensors(run_dir, synthetic) if run_dir else None
    source = dumped if dumped is not None and dumped.available() else synthetic
    chosen = [op for op in operators if not only or any(s in op.name for s in only)]
    started_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    clock = time.perf_counter()
    results = []
    fp32_reduced = reduced_fp32(device)
    for i, op in enumerate(chosen, 1):
        res = verify_signature(op, device, source=source, standards=standards, max_elements=max_elements,
                               fp32_reduced=fp32_reduced)
        results.append(res)
        if progress is not None:
            progress(i, len(chosen), res)
    rows = [r.to_dict() for r in results]
    from opscope.replay.substitutes import verify_substitutes
    substitute_rows = verify_substitutes(operators, device, source=source, standards=standards,
                                         substitutes=substitutes, only=only)
    return {
        "substitutes": substitute_rows,
        "substitute_counts": summarise(substitute_rows),
        "device": device_name,
        "started_at": started_at,
        "duration_s": round(time.perf_counter() - clock, 3),
        "inputs": "dumped" if isinstance(source, DumpedTensors) else "synthetic",
        "seed": seed,
        "reference": ("none: on the CPU the device run is the reference run; floating-point results are "
                      "measured against the CPU float64 oracle (CPU numerics, not NPU evidence)")
        if device.type == "cpu" else "CPU in the captured dtype; oracle: CPU float64" + _fp32_note(fp32_reduced),
        "standards": "support_matrix/verify_standards.yaml (mindstudio-probe 26.2.0 accuracy-checker standards)",
        "counts": summarise(rows),
        "results": rows,
    }
