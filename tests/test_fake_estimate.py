"""Issue #33 class 9: a fake scan of a nanoGPT-shaped trainer prices what the NPU runs.

- the step's gradient bytes are the parameters' (every parameter group), whatever list the optimizer phase
  recorded first;
- the memory fit counts F.scaled_dot_product_attention as torch_npu's fused kernel keeps it, not the CPU
  math path's batch x heads x S x S intermediates, and says so;
- repeated no-grad forwards (estimate_loss()) with shapes already seen are not re-run, and the scan says so.
"""
from __future__ import annotations

import math

import pytest
from conftest import SCRIPTS, load_scan, run_opscope

from opscope.model import Operator, Step

SCRIPT = SCRIPTS / "fake_attention_eval.py"
B, T, H = 2, 512, 4            # the script's defaults
EVAL_ITERS = 30                # per split: 60 no-grad forwards at iteration 0


def _op(name, shapes, dtypes, calls=1):
    return Operator(name=name, input_shapes=shapes, dtypes=dtypes, scalars=[], phase="optimizer", calls=calls,
                    steps=[2], source="train.py:7", verdict="native")


def _gpt2_xl_optimizer_phase(clip: bool) -> tuple[list[Operator], int]:
    """One step's optimizer-phase signatures of nanoGPT's train.py at GPT-2 XL size (48 layers, d 1600,
    no biases, char vocabulary 65), fused AdamW in two weight-decay groups, as a fake scan records them."""
    layers, d = 48, 1600
    decay = [[65, d], [1024, d]] + [[3 * d, d], [d, d], [4 * d, d], [d, 4 * d]] * layers
    nodecay = [[d]] * (2 * layers + 1)
    every = decay + nodecay
    adamw = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]
    ops = []
    if clip:   # clip_grad_norm_: per-tensor norms (0-dim) stacked, listed before the norms themselves
        ops.append(_op("aten::stack", [[[]] * len(every), []], ["TensorList", "Scalar"]))
    ops += [_op("aten::_foreach_add_", [[[]] * len(decay), []], ["TensorList", "Scalar"]),
            _op("aten::_foreach_add_", [[[]] * len(nodecay), []], ["TensorList", "Scalar"]),
            _op("aten::_fused_adamw_", [decay] * 6 + [[]] * 9, adamw),
            _op("aten::_fused_adamw_", [nodecay] * 6 + [[]] * 9, adamw)]
    if clip:
        ops += [_op("aten::_foreach_norm", [every, []], ["TensorList", "Scalar"]),
                _op("aten::_foreach_mul_", [every, []], ["TensorList", "Tensor"])]
    return ops, sum(math.prod(s) for s in every)


@pytest.mark.parametrize("clip", [True, False])
def test_gradient_bytes_are_every_parameter_not_the_longest_list(clip):
    from opscope.analysis.npu.estimate import build_basis, price
    ops, params = _gpt2_xl_optimizer_phase(clip)
    basis = build_basis(ops, [Step(index=1), Step(index=2)])
    assert params == 1_476_457_600   # nanoGPT prints 1,476,302,400 decayed + 155,200 non-decayed
    assert basis.gradients.bytes == 4 * params   # fp32 gradients: 5.9 GB, not 291 x 4 bytes
    assert basis.gradients.parameters == 291
    step = price(basis, "910B2").step
    assert step.gradient_bytes == 4 * params
    eight = step.world(8)
    assert eight is not None and eight.communication_us > 50_000   # a 5.9 GB ring all-reduce on 8 cards: tens of ms at least


@pytest.fixture(scope="module")
def eval_scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake_attention_eval")
    proc = run_opscope("scan", SCRIPT, "--mode", "fake", "--steps", "3", "--out", out, "--format", "json", "-q",
                       "--", "--eval-iters", EVAL_ITERS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return load_scan(out)


def test_memory_fit_counts_attention_as_the_fused_npu_kernel(eval_scan):
    fit = eval_scan["memory_fit"]
    scores = B * H * T * T * 4    # one fp32 B x heads x S x S matrix: the math path makes several per call
    assert fit["parts"]["activations"] < scores, fit["parts"]
    assert "FlashAttentionScore" in fit["basis"] and "not counted" in fit["basis"]
    assert any(n.startswith("memory fit: attention counted as the NPU runs it") for n in eval_scan["notes"])
    params = fit["parts"]["parameters"]
    assert fit["parts"]["gradients"] == params == eval_scan["npu_estimate"]["gradients"]["bytes"]


def test_repeated_no_grad_forwards_are_not_re_run_and_the_scan_says_so(eval_scan):
    lines = SCRIPT.read_text().splitlines()
    call = next(i for i, line in enumerate(lines, 1) if "_, loss = model(X, Y)" in line)
    item = next(i for i, line in enumerate(lines, 1) if "losses[k] = loss.item()" in line)
    skipped = eval_scan["fake_mode"]["skipped_forwards"]
    recorded = 4   # the session records the first evaluation forwards of a step (EVAL_FORWARDS_RECORDED)
    assert skipped == [{"module": "Tiny", "where": f"{SCRIPT.name}:{call}", "count": 2 * EVAL_ITERS - recorded}]
    assert any("repeated no-grad forward(s) of Tiny" in n and "not re-run" in n for n in eval_scan["notes"])
    # the loop still ran every iteration (each read its placeholder loss), and what was recorded is unchanged
    reads = next(p for p in eval_scan["fake_mode"]["places"] if p["where"] == f"{SCRIPT.name}:{item}")
    assert reads["count"] == 2 * EVAL_ITERS
    sdpa = [op for op in eval_scan["operators"] if op["name"] == "aten::scaled_dot_product_attention"]
    assert {"eval", "forward"} <= {phase for op in sdpa for phase in op["phases"]}
    assert sum(op["calls"] for op in sdpa) == 3 + recorded   # 3 training steps' forwards, 4 evaluation ones
