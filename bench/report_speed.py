"""How long report generation takes for a big run (5,000 operator signatures).

    python bench/report_speed.py [--ops 5000] [--out DIR]

Prints seconds per format and the file sizes.  The scan is synthetic but shaped like
a real one: a mix of verdicts, dynamic ops with root causes, CUDA findings.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from opscope.model import VERDICTS, DynamicShape, Finding, Operator, RootCause, ScanResult, Step

NAMES = ["aten::conv2d", "aten::convolution_backward", "aten::addmm", "aten::mm", "aten::bmm", "aten::add",
         "aten::mul", "aten::relu", "aten::gelu", "aten::layer_norm", "aten::softmax", "aten::nonzero",
         "aten::index", "aten::_unique2", "aten::huber_loss", "torchvision::roi_align", "aten::embedding",
         "aten::cat", "aten::view", "aten::copy_"]


def synthetic_scan(n_ops: int = 5000, seed: int = 0) -> ScanResult:
    """A ScanResult with ``n_ops`` distinct operator signatures."""
    rng = random.Random(seed)
    share = {"native": 60, "composite": 15, "adapter": 2, "cpu-fallback": 8, "unsupported": 6, "not-applicable": 3,
             "unknown": 8}
    weights = [share.get(v, 0) for v in VERDICTS]   # by name: a verdict added later gets its own share
    operators = []
    for i in range(n_ops):
        name = NAMES[i % len(NAMES)]
        batch = 1 + i // len(NAMES)
        verdict = rng.choices(VERDICTS, weights)[0]
        operators.append(Operator(
            name=name, input_shapes=[[batch, 64, 28, 28], [64, 64, 3, 3], []], dtypes=["float", "float", "Scalar"],
            calls=rng.randint(1, 500), self_time_us=rng.uniform(1, 5000), total_time_us=rng.uniform(5000, 9000),
            phase=rng.choice(["forward", "backward", "optimizer", "other"]), source=f"model/layer{i % 97}.py:{i % 400 + 1}",
            steps=[1, 2, 3], dynamic=name in ("aten::nonzero", "aten::index"), verdict=verdict,
            evidence={"list": "op_plugin", "version": "2.6.0", "rule": f"rule-{i % 7}"},
            substitute={"replacement": "torch.nn.functional.smooth_l1_loss", "rationale": "fused"} if i % 11 == 0 else None))
    dynamic = [DynamicShape(op=f"aten::nonzero_{i}", source=f"train.py:{100 + i}", cause="data-dependent-output",
                            varying_dims=[{"arg": 0, "dim": 0, "values": [32, 8 + i]}],
                            shapes_per_step={str(s): [[[32 if s < 3 else 8 + i]]] for s in (1, 2, 3)},
                            root_cause=f"train.py:{100 + i}", suggestion="pad to a fixed size") for i in range(50)]
    roots = [RootCause(source=d.source, cause=d.cause, ops=[d.op, "aten::index"], varying_dims=d.varying_dims,
                       suggestion=d.suggestion) for d in dynamic]
    findings = [Finding(rule="cuda-device", file=f"pkg/mod{i}.py", line=i + 1, api="torch.cuda.synchronize",
                        message="CUDA-only API", replacement="torch.npu.synchronize") for i in range(200)]
    steps = [Step(index=s, duration_us=1e6, op_calls=n_ops) for s in (1, 2, 3)]
    return ScanResult(script="/bench/train.py", argv=["--big"], device="cpu", torch_version="2.13.0",
                      complete=True, tool_version="bench", steps=steps, operators=operators,
                      dynamic_shapes=dynamic, root_causes=roots, findings=findings,
                      summary={"readiness_score": 61.0}, target={"package": "torch_npu", "version": "2.6.0"},
                      settings={"steps": 3})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000, help="operator signatures (default 5000)")
    parser.add_argument("--out", type=Path, help="keep the reports here (default: a temporary folder)")
    args = parser.parse_args(argv)
    from opscope.report.render import write_reports

    result = synthetic_scan(args.ops)
    out = args.out or Path(tempfile.mkdtemp(prefix="opscope-bench-"))
    print(f"{args.ops} operator signatures -> {out}")
    total = 0.0
    for fmt in ("html", "xlsx", "md", "json"):
        t0 = time.perf_counter()
        (path,) = write_reports(result, out, (fmt,))
        seconds = time.perf_counter() - t0
        total += seconds
        print(f"{fmt:5s} {seconds:6.2f} s  {path.stat().st_size / 1e6:6.2f} MB  {path.name}")
    print(f"total {total:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
