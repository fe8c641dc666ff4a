"""GPU backend kernels judged, priced and memory-fitted as the public op the NPU runs (issue 40, item 2).

A GPU run records ATen ops a CPU run never does: cuDNN's, FlashAttention's and the memory-efficient
attention's kernels for SDPA, cuDNN's batch norm, convolution, RNN, CTC loss and grid sampler.  They never run
on an NPU (torch_npu runs the public op they implement), so ``support_matrix/backend_private_ops.yaml``
``implements`` maps each to its public op.  The shared H200 scans (``../shared/data/gpu_h200_torch2.11``,
written before the mapping existed) are re-judged with ``opscope report RUN --target``, as a user would.
"""
from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

from conftest import SCRIPTS, SHARED, load_scan, run_opscope
from opscope.model import Operator, Step

GPU = SHARED / "data" / "gpu_h200_torch2.11"
needs_gpu_scans = pytest.mark.skipif(not (GPU / "gpt2" / "scan.json").is_file(),
                                     reason="../shared/data/gpu_h200_torch2.11 absent")
BAD = ("unsupported", "cpu-fallback", "unknown")
TARGET = "2.14.0"


def _retarget(run: Path, tmp_path: Path, name: str) -> dict:
    """``opscope report RUN --target 2.14.0`` on a copy of ``run`` (never written into): the re-judged scan."""
    copy = tmp_path / name
    shutil.copytree(run, copy)
    out = tmp_path / f"{name}_out"
    proc = run_opscope("report", copy, "--target", TARGET, "--format", "json", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_scan(out)


def _gpu_only(name: str) -> bool:
    """An op of the scanning GPU's backend: an ``implements`` entry or a backend-private pattern."""
    from opscope.knowledge import backend_kernel, backend_private_patterns
    base = name.rpartition("::")[2]
    return bool(backend_kernel(name)) or any(re.fullmatch(p.replace("*", ".*"), base)
                                             for p in backend_private_patterns())


def _public_verdicts(scan: dict) -> dict[str, set]:
    """Verdicts of the operators that need an NPU kernel, by name (backend kernels as the op they implement)."""
    from opscope.knowledge import backend_kernel
    out: dict[str, set] = {}
    for op in scan["operators"]:
        if op["verdict"] == "not-applicable":
            continue
        kernel = backend_kernel(op["name"])
        out.setdefault(kernel["op"] if kernel else op["name"], set()).add(op["verdict"])
    return out


# -- the shared GPU scans, re-judged ------------------------------------------------------------------------
@needs_gpu_scans
def test_gpt2_gpu_scan_judges_cudnn_attention_as_sdpa(tmp_path):
    scan = _retarget(GPU / "gpt2", tmp_path, "gpt2")
    ops = {op["name"]: op for op in scan["operators"]}
    backward = ops["aten::_scaled_dot_product_cudnn_attention_backward"]
    assert backward["verdict"] == "native", backward["evidence"]
    evidence = backward["evidence"]
    assert evidence["rule"] == "backend-implements"
    assert evidence["implements"] == "aten::scaled_dot_product_attention" and evidence["part"] == "backward"
    assert evidence["detail"].startswith("recorded as aten::_scaled_dot_product_cudnn_attention_backward "
                                         "(cuDNN's SDPA backend on the GPU)")
    assert "npu_fusion_attention" in evidence["detail"] and "910A" in evidence["detail"]
    forward = ops["aten::_scaled_dot_product_cudnn_attention"]
    assert forward["verdict"] == "not-applicable" and forward["evidence"]["rule"] == "inside-parent-kernel"
    assert "recorded as aten::_scaled_dot_product_cudnn_attention (cuDNN" in forward["evidence"]["detail"]
    bad = [(op["name"], op["verdict"]) for op in scan["operators"] if _gpu_only(op["name"]) and op["verdict"] in BAD]
    assert not bad
    assert scan["summary"]["verdict_counts"]["unsupported"] == 0
    assert not scan["summary"]["blocking_ops"]
    # priced as SDPA's backward: the fused gradient kernel on an A2 chip, the math path on a 910A
    row = next(r for r in scan["npu_estimate"]["basis"]["rows"]
               if r["name"] == "aten::_scaled_dot_product_cudnn_attention_backward")
    assert [k["type"] for k in row["kernels"]] == ["FlashAttentionScoreGrad"]
    assert row["alternative"]["families"] == ["910A"]
    assert any(r["kind"] == "backend-kernel" and "the backward of scaled_dot_product_attention" in r["text"]
               for r in row["reasons"])
    forward_row = next(r for r in scan["npu_estimate"]["basis"]["rows"]
                       if r["name"] == "aten::scaled_dot_product_attention")
    fwd, bwd = forward_row["kernels"][0], row["kernels"][0]
    assert bwd["flops"] == pytest.approx(2.5 * fwd["flops"])   # causal read from cuDNN's own argument order


@needs_gpu_scans
def test_cnn_gpu_scan_prices_cudnn_batch_norm_as_native_batch_norm(tmp_path):
    scan = _retarget(GPU / "cnn", tmp_path, "cnn")
    bad = [(op["name"], op["verdict"]) for op in scan["operators"] if _gpu_only(op["name"]) and op["verdict"] in BAD]
    assert not bad
    rows = [r for r in scan["npu_estimate"]["basis"]["rows"] if r["name"] == "aten::_batch_norm_impl_index"]
    assert rows
    for row in rows:
        assert [k["type"] for k in row["kernels"]] == ["BNTrainingReduce", "BNTrainingUpdate"], row["kernels"]
        assert not any("(generic)" in k["type"] for k in row["kernels"])
        assert any("ran aten::cudnn_batch_norm (cuDNN's batch norm on the GPU)" in r["text"] for r in row["reasons"])


@needs_gpu_scans
def test_cnn_gpu_scan_scores_as_its_stand_in_scan(tmp_path, cnn_scan):
    gpu = _retarget(GPU / "cnn", tmp_path, "cnn")
    cpu = _retarget(cnn_scan, tmp_path, "cnn_cpu")
    assert abs(gpu["summary"]["readiness_score"] - cpu["summary"]["readiness_score"]) <= 2
    assert gpu["plan"]["oldest"]["torch_npu"] == cpu["plan"]["oldest"]["torch_npu"]
    gpu_v, cpu_v = _public_verdicts(gpu), _public_verdicts(cpu)
    assert {n: gpu_v[n] for n in gpu_v.keys() & cpu_v.keys()} == {n: cpu_v[n] for n in gpu_v.keys() & cpu_v.keys()}


@needs_gpu_scans
@pytest.mark.slow
def test_gpt2_gpu_scan_scores_as_the_stand_in_scan_of_nanogpt(tmp_path):
    """The stand-in scan of the bundled nanoGPT train.py (same structure, tiny sizes, bf16, no dropout) and the
    H200 scan of nanoGPT at GPT-2 small size: the same score (within 2), plan and verdicts of the public ops."""
    out = tmp_path / "nanogpt_cpu"
    proc = run_opscope("scan", SCRIPTS / "frameworks" / "nanogpt_train.py", "--steps", "4", "-o", out,
                       "--format", "", "--quiet", "--", "--dropout=0.0", "--compile=False", "--max_iters=6",
                       "--eval_interval=1000", "--eval_iters=2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = _retarget(out, tmp_path, "nanogpt_cpu_copy")
    gpu = _retarget(GPU / "gpt2", tmp_path, "gpt2")
    assert abs(gpu["summary"]["readiness_score"] - cpu["summary"]["readiness_score"]) <= 2
    assert gpu["plan"]["oldest"]["torch_npu"] == cpu["plan"]["oldest"]["torch_npu"]
    assert gpu["plan"]["fewest_blocking"] == cpu["plan"]["fewest_blocking"] == 0
    gpu_v, cpu_v = _public_verdicts(gpu), _public_verdicts(cpu)
    assert gpu_v["aten::scaled_dot_product_attention"] == cpu_v["aten::scaled_dot_product_attention"] == {"native"}
    assert {n: gpu_v[n] for n in gpu_v.keys() & cpu_v.keys()} == {n: cpu_v[n] for n in gpu_v.keys() & cpu_v.keys()}


# -- the data ---------------------------------------------------------------------------------------------
def _native_functions() -> dict[str, dict]:
    import torchgen
    import yaml
    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    entries = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    out: dict = {}
    for e in entries:   # by name, the overload without a name first (lstm: lstm.input)
        name = e["func"].split("(", 1)[0]
        if "." not in name or name.split(".")[0] not in out:
            out[name.split(".")[0]] = e
    return out


def _arg_types(func: str) -> list[str]:
    """Each argument's type, normalised (``SymInt[]``/``int[2]`` -> ``int[]``, ``Tensor?`` -> ``Tensor``)."""
    inside = func.split("(", 1)[1].rsplit(") ->", 1)[0]
    out = []
    for arg in (a.strip() for a in inside.split(",")):
        if not arg or arg == "*":
            continue
        kind = re.sub(r"\(\w!?\)", "", arg.split()[0]).rstrip("?").replace("SymInt", "int")
        out.append(re.sub(r"\[\d+\]", "[]", kind).rstrip("?"))
    return out


def test_every_backend_kernel_is_a_backend_only_op_of_torch_mapped_to_a_public_op():
    from opscope.knowledge import load
    data = load("backend_private_ops.yaml")
    funcs = _native_functions()
    composite = ("CompositeImplicitAutograd", "CompositeExplicitAutograd")
    for name, entry in data["implements"].items():
        assert name in funcs, f"{name}: not an op of torch's native_functions.yaml"
        keys = {k.strip() for key in (funcs[name].get("dispatch") or {}) for k in key.split(",")}
        assert keys and not keys & set(composite), f"{name} is not one backend's kernel: {keys}"
        assert entry["op"] in funcs, f"{name} -> {entry['op']}: not an ATen op"
        assert entry["part"] in ("forward", "backward") and entry.get("backend")
        publics = [entry["op"], *((entry.get("by_mode") or {}).get("ops") or {}).values()]
        for public in publics:
            assert public in funcs, f"{name} -> {public}: not an ATen op"
            assert public in data["public_ops"] or "for_cpu" in name, f"{public}: public_ops does not say how " \
                                                                       "torch_npu runs it"
        if entry.get("by_mode"):
            assert _arg_types(funcs[name]["func"])[entry["by_mode"]["arg"]] == "int", name
        priced = entry.get("priced_as") or entry["op"]
        if entry.get("args"):
            want, have = _arg_types(funcs[priced]["func"]), _arg_types(funcs[name]["func"])
            assert len(entry["args"]) <= len(want), name
            for i, j in enumerate(entry["args"]):
                if j is not None:
                    assert have[j] == want[i], f"{name} argument {j} ({have[j]}) is not {priced}'s {i} ({want[i]})"


def test_no_backend_kernel_listed_is_one_torch_npu_registers():
    """A kernel torch_npu registers itself (op-plugin: _masked_scale, _conv_depthwise2d, the fused optimizers)
    is judged by its own registration, not as another op."""
    from opscope.analysis.verdicts.support import _Context
    from opscope.knowledge import load
    from opscope.matrix.store import load_matrix, resolve_release
    matrix = load_matrix()
    ctx = _Context([], matrix, resolve_release(matrix, TARGET))
    for name in load("backend_private_ops.yaml")["implements"]:
        assert ctx.intrinsic(f"aten::{name}", None).verdict != "native", name


def test_a_backend_kernel_run_by_its_autograd_node_is_recorded_not_folded_away():
    """cuDNN's batch-norm backward runs straight from CudnnBatchNormBackward0, with no public operator around
    it: capture records it (to be judged as native_batch_norm_backward) instead of folding it into nothing.
    A kernel inside its public operator (cudnn_convolution in _convolution) still folds."""
    from opscope.capture.events import _classify
    from opscope.parsers.calls import OPERATOR, PRIVATE
    for name in ("aten::cudnn_batch_norm_backward", "aten::cudnn_batch_norm", "aten::_cudnn_rnn_backward",
                 "aten::cudnn_grid_sampler_backward", "aten::_scaled_dot_product_cudnn_attention_backward"):
        assert _classify(name) == OPERATOR, name
    for name in ("aten::cudnn_convolution", "aten::_cudnn_attention_backward", "aten::_cudnn_rnn",
                 "aten::mkldnn_convolution"):
        assert _classify(name) == PRIVATE, name


# -- a GPU scan as capture now records it, against the CPU's ------------------------------------------------
def _op(name, shapes, dtypes=None, phase="forward", parent=None, scalars=None, children=None):
    return Operator(name=name, input_shapes=shapes, dtypes=dtypes or ["float"] * len(shapes), scalars=scalars or [],
                    phase=phase, calls=1, steps=[2], parent=parent, source="train.py:7", children=children or [])


def _judged_and_priced(ops, chip="910B2", steps=(1, 2)):
    from opscope.analysis.npu.estimate import build_basis, price
    from opscope.analysis.verdicts.support import assign_verdicts
    assign_verdicts(ops, TARGET)
    basis = build_basis(ops, [Step(index=i) for i in steps])
    return ({op.name: op for op in ops}, {r["name"]: r for r in basis.rows},
            {r.operator: r.to_dict() for r in price(basis, chip).operator_rows()})


X = [32, 64, 28, 28]
C = [64]


def test_cudnn_batch_norm_is_judged_and_priced_as_the_cpus_native_batch_norm():
    bn = [X, C, C, C, C, [], [], []]
    scalars = [None, None, None, None, None, True, 0.1, 1e-5]
    cpu = [_op("aten::batch_norm", bn + [[]], scalars=scalars + [True], children=["aten::_batch_norm_impl_index"]),
           _op("aten::_batch_norm_impl_index", bn + [[]], parent="aten::batch_norm", scalars=scalars + [True],
               children=["aten::native_batch_norm"]),
           _op("aten::native_batch_norm", bn, parent="aten::_batch_norm_impl_index", scalars=scalars),
           _op("aten::native_batch_norm_backward", [X, X, C, C, C, C, C, [], [], []], phase="backward",
               scalars=[None] * 7 + [True, 1e-5, [True, True, True]])]
    gpu = [_op("aten::batch_norm", bn + [[]], scalars=scalars + [True], children=["aten::_batch_norm_impl_index"]),
           _op("aten::_batch_norm_impl_index", bn + [[]], parent="aten::batch_norm", scalars=scalars + [True],
               children=["aten::cudnn_batch_norm"]),
           _op("aten::cudnn_batch_norm", bn, parent="aten::_batch_norm_impl_index", scalars=scalars),
           _op("aten::cudnn_batch_norm_backward", [X, X, C, C, C, C, C, [], [X[1]]], phase="backward",
               scalars=[None] * 7 + [1e-5, None])]
    cpu_ops, cpu_rows, cpu_priced = _judged_and_priced(cpu)
    gpu_ops, gpu_rows, gpu_priced = _judged_and_priced(gpu)
    forward, backward = gpu_ops["aten::cudnn_batch_norm"], gpu_ops["aten::cudnn_batch_norm_backward"]
    assert forward.verdict == cpu_ops["aten::native_batch_norm"].verdict == "native"
    assert backward.verdict == cpu_ops["aten::native_batch_norm_backward"].verdict == "native"
    assert forward.evidence["implements"] == "aten::native_batch_norm"
    assert backward.evidence["implements"] == "aten::native_batch_norm_backward"
    assert backward.evidence["detail"].startswith("recorded as aten::cudnn_batch_norm_backward (cuDNN's batch norm")
    assert set(gpu_rows) == {"aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward"}   # the wrapper is not
    for cpu_name, gpu_name in (("aten::native_batch_norm", "aten::cudnn_batch_norm"),
                               ("aten::native_batch_norm_backward", "aten::cudnn_batch_norm_backward")):
        assert gpu_rows[gpu_name]["kernels"] == cpu_rows[cpu_name]["kernels"]
        assert gpu_priced[gpu_name]["npu_time_us"] == pytest.approx(cpu_priced[cpu_name]["npu_time_us"])


Q = [8, 12, 256, 128]
LSE = [8, 12, 256]


@pytest.mark.parametrize("chip", ["910B2", "910A"])
def test_every_sdpa_backend_backward_is_priced_as_sdpas_backward(chip):
    """cuDNN's, FlashAttention's and the memory-efficient backward, each with its own argument order (causal
    where each keeps is_causal), cost what the CPU's SDPA backward costs: the fused gradient on an A2 chip, the
    math path on a 910A."""
    base = _op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", [Q, Q, Q, Q, Q, LSE, [], [], [], []],
               phase="backward", scalars=[None] * 6 + [0.0, True, None, None])
    cudnn = _op("aten::_scaled_dot_product_cudnn_attention_backward",
                [Q, Q, Q, Q, Q, LSE, [], [], [], [], [], [], [], [], [], []], phase="backward",
                scalars=[None] * 11 + [256, 256, 0.0, True, None])
    flash = _op("aten::_scaled_dot_product_flash_attention_backward",
                [Q, Q, Q, Q, Q, LSE, [], [], [], [], [], [], [], [], []], phase="backward",
                scalars=[None] * 8 + [256, 256, 0.0, True, None, None, None])
    efficient = _op("aten::_scaled_dot_product_efficient_attention_backward",
                    [Q, Q, Q, Q, [], Q, LSE, [], [], [], [], [], []], phase="backward",
                    scalars=[None] * 9 + [0.0, [True, True, True, False], True, None])
    _, _, want = _judged_and_priced([base], chip)
    for op in (cudnn, flash, efficient):
        ops, rows, priced = _judged_and_priced([op], chip)
        assert ops[op.name].verdict == "native", (op.name, ops[op.name].evidence)
        row, ref = priced[op.name], want[base.name]
        assert row["kernels"] == ref["kernels"] and row["npu_time_us"] == pytest.approx(ref["npu_time_us"]), op.name
        flops = rows[op.name]["kernels"][0]["flops"]
        if chip != "910A":
            assert flops == 4.0 * math.prod(Q) * 256 * 0.5 * 2.5, op.name   # causal: half the score matrix



def test_cudnn_rnn_backward_is_judged_as_the_rnn_its_mode_names():
    """cuDNN runs lstm, gru, rnn_tanh and rnn_relu as _cudnn_rnn; its mode argument says which (3: GRU)."""
    x = [5, 3, 10]
    args = [x, [], [], [], [3, 3, 20], [], x, x, [], [], [], [], [], [], [], [], [], [], [], [], [], []]
    scalars = [None] * 10 + [3, 20, 0, 1, False, 0.0, True, False, [], None, None, [True, True, True, True]]
    ops, _, _ = _judged_and_priced([_op("aten::_cudnn_rnn_backward", args, phase="backward", scalars=scalars)])
    op = ops["aten::_cudnn_rnn_backward"]
    assert op.verdict == "native" and op.evidence["implements"] == "aten::gru", op.evidence
    assert op.evidence["detail"].startswith("recorded as aten::_cudnn_rnn_backward (cuDNN's RNN on the GPU)")


@needs_gpu_scans
def test_the_h200_cnn_trace_replayed_records_cudnn_batch_norm_and_its_backward():
    """The shared H200 trace of the bundled CNN through the scan's own event path: cuDNN's batch norm and its
    backward are operators (the backward had no operator around it, so it was folded away: its kernels and
    its NPU price were lost), judged and priced as native_batch_norm(_backward)."""
    from kineto_trace import kineto_events, load_trace

    from opscope.analysis.aggregate import aggregate
    from opscope.capture.events import calls_from_kineto, compact_calls
    path = GPU / "cnn" / "traces" / "step_0003.json.gz"
    calls = compact_calls(calls_from_kineto(kineto_events(load_trace(path)), 3, [], None, release=True))
    names = {c.name for c in calls}
    assert {"aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward"} <= names
    backward = [c for c in calls if c.name == "aten::cudnn_batch_norm_backward"]
    assert all(c.parent is None and c.phase == "backward" and c.device_time_us > 0 for c in backward)
    ops, rows, _ = _judged_and_priced(aggregate(calls), steps=(2, 3))
    for name, public in (("aten::cudnn_batch_norm", "aten::native_batch_norm"),
                         ("aten::cudnn_batch_norm_backward", "aten::native_batch_norm_backward")):
        assert ops[name].verdict == "native" and ops[name].evidence["implements"] == public
        assert [k["type"] for k in rows[name]["kernels"]] in (["BNTrainingReduce", "BNTrainingUpdate"],
                                                              ["BNTrainingUpdateGrad", "BNTrainingReduceGrad"])


@needs_gpu_scans
def test_opscope_diff_reads_a_standalone_backend_kernel_as_the_scan_does(tmp_path):
    """`opscope diff` folds backend-private work by the same table: cuDNN's batch-norm backward is an operator
    there too, with the kernel time the scan charges it (it was folded into nothing)."""
    import gzip
    from collections import Counter

    from kineto_trace import kineto_events, load_trace

    from opscope.capture.events import calls_from_kineto, compact_calls
    from opscope.parsers.chrome_trace import load_chrome_trace
    path = GPU / "cnn" / "traces" / "step_0003.json.gz"
    plain = tmp_path / "step.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    filed: Counter = Counter()
    for c in load_chrome_trace(plain).calls:
        filed[c.name] += c.device_time_us
    live: Counter = Counter()
    for c in compact_calls(calls_from_kineto(kineto_events(load_trace(path)), 3, [], None, release=True)):
        live[c.name] += c.device_time_us
    name = "aten::cudnn_batch_norm_backward"
    assert filed[name] > 0 and filed[name] == pytest.approx(live[name], rel=1e-3)
    assert {k: round(v, 1) for k, v in live.items() if v} == {k: round(v, 1) for k, v in filed.items() if v}
