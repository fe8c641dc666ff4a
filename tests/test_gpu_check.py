"""bench/gpu_check.py without a GPU: the table it builds from runs, its one-line refusal, and (when the shared H200
runs are at hand) the figures of issue 40's table read back from them."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, SHARED, bench_module

gpu_check = bench_module("gpu_check")

H200 = SHARED / "data" / "gpu_h200_torch2.11"


def _trace(ops: list[tuple[str, int]], tasks: list[tuple[str, int, float]]) -> dict:
    """A Kineto-shaped trace: cpu_op events with their External id, and device tasks naming one of them."""
    events = [{"ph": "X", "cat": "cpu_op", "name": name, "ts": i, "dur": 1, "args": {"External id": ext}}
              for i, (name, ext) in enumerate(ops)]
    events += [{"ph": "X", "cat": cat, "name": "k", "ts": 10, "dur": dur, "args": {"External id": ext}}
               for cat, ext, dur in tasks]
    return {"traceEvents": events}


def _run(tmp_path, device_time: dict[str, float], gz: bool = False):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    trace = _trace([("aten::addmm", 1), ("aten::cudnn_convolution", 2), ("aten::copy_", 3)],
                   [("kernel", 1, 300.0), ("kernel", 2, 600.0), ("gpu_memcpy", 3, 100.0)])
    for step in (1, 2):
        path = run / "traces" / f"step_000{step}.json"
        if gz:
            with gzip.open(f"{path}.gz", "wt") as fh:
                json.dump(trace, fh)
        else:
            path.write_text(json.dumps(trace))
    ops = [{"name": name, "device_time_us": us, "on_device": True} for name, us in device_time.items()]
    scan = {"operators": ops, "traces": ["traces/step_0001.json", "traces/step_0002.json"]}
    (run / "scan.json").write_text(json.dumps(scan))
    return run


@pytest.mark.parametrize("gz", [False, True])
def test_kernel_time_is_met_within_five_percent_of_the_traces_kernels(tmp_path, gz):
    # cudnn_convolution is folded into convolution by the scan: its kernels count in the total, not by name
    run = _run(tmp_path, {"aten::addmm": 600.0, "aten::convolution": 1200.0, "aten::copy_": 0.0}, gz=gz)
    total, silent = gpu_check.kernel_rows("CNN", run)
    assert total.met is True and "0.900 ms/step vs 0.900 ms of kernels (1.000 ms" in total.measured
    assert silent.met is True and silent.measured == "0"   # copy_ launched a memcpy, not a kernel


def test_no_kernel_time_in_scan_json_is_not_met(tmp_path):
    run = _run(tmp_path, {"aten::addmm": 0.0, "aten::convolution": 0.0})
    total, silent = gpu_check.kernel_rows("CNN", run)
    assert total.met is False and silent.met is False and "`aten::addmm`" in silent.measured
    assert "cudnn" not in silent.measured     # not an operator of scan.json: not asked about
    assert "copy_" not in silent.measured


def test_backend_verify_memory_and_overhead_rows():
    judged = {"operators": [{"name": "aten::_scaled_dot_product_cudnn_attention_backward", "verdict": "unsupported"},
                            {"name": "aten::huber_loss", "verdict": "cpu-fallback"},       # not a backend kernel
                            {"name": "aten::cudnn_batch_norm", "verdict": "native"}],
              "summary": {"readiness_score": 80}}
    row = gpu_check.backend_row("GPT-2", judged)
    assert row.met is False and row.measured.startswith("1: `aten::_scaled_dot_product_cudnn_attention_backward`")
    assert gpu_check.backend_row("GPT-2", {"operators": judged["operators"][1:]}).met is True

    ok = gpu_check.verify_row("CNN", {"verification": {"counts": {"pass": 134}}}, 0)
    bad = gpu_check.verify_row("CNN", {"verification": {"counts": {"pass": 124, "fail": 10}}}, 6)
    assert ok.met is True and bad.met is False and bad.measured == "exit 6: 124 pass, 10 fail"
    assert gpu_check.verify_row("CNN", {}, None).met is None

    scan = {"memory_fit": {"peak_bytes": 5_507_750_400}}
    mem = gpu_check.memory_row("GPT-2", scan, 'iter 3: ...\nPEAK {"max_allocated": 5506832896}\n')
    assert mem.met is True and "(1.0002)" in mem.measured
    assert gpu_check.memory_row("GPT-2", {"memory_fit": None}, None).met is None

    log = "".join(f"iter {i}: loss 4.2, time {t}ms, mfu -100.00%\n" for i, t in enumerate([900, 60, 50, 24, 25, 23]))
    assert gpu_check.median_iteration_ms(log) == 24.0          # iterations 3 onwards
    rows = gpu_check.overhead_rows("GPT-2", {"plain": log, "profiler-cpu": log.replace("time 2", "time 4"),
                                            "profiler-cuda": log.replace("time 2", "time 5"),
                                            "scan": log.replace("time 2", "time 22")})
    assert rows[0].measured == "plain 24.0; bare profiler 44.0 CPU, 54.0 CPU+CUDA; scan 224.0"
    assert rows[1].measured == "9.3x, 4.1x" and rows[1].met is False


def test_the_suites_row_is_pytests_summary():
    row = gpu_check.suite_row("...\n716 passed, 98 skipped, 13 failed in 312.45s (0:05:12)\n")
    assert row.measured == "716 passed, 98 skipped, 13 failed in 312.45s (0:05:12)" and row.met is False
    assert gpu_check.suite_row("===== 9 passed, 1 warning in 41.19s =====\n").met is True
    assert gpu_check.suite_row("Killed\n").met is False


def test_render_is_one_markdown_table_with_date_commit_card_and_torch():
    rows = [gpu_check.Row("a | b", "1", "2", True), gpu_check.Row("c", "3", "-", None)]
    text = gpu_check.render(rows, {"date": "2026-11-28", "commit": "970466c", "gpu": "NVIDIA H200",
                                   "torch": "2.11.0+cu130", "command": "python bench/gpu_check.py"})
    lines = text.splitlines()
    assert lines[0] == "### 2026-11-28, commit 970466c, NVIDIA H200, torch 2.11.0+cu130"
    assert lines[2] == "| what | measured | wanted | met |"
    assert lines[4] == "| a \\| b | 1 | 2 | yes |" and lines[5] == "| c | 3 | - | - |"


def test_the_suite_runs_with_the_gpu_hidden_and_gpu_env_gives_it_back():
    """conftest.py: every test (and every process it starts) sees no GPU; a ``gpu`` test's processes get the
    CUDA_VISIBLE_DEVICES the suite was started with."""
    import os

    import torch
    from conftest import gpu_env
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and not torch.cuda.is_available()
    show = "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    child = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "''"
    given = os.environ["OPSCOPE_TEST_CUDA_VISIBLE_DEVICES"]
    child = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=60, env=gpu_env())
    assert child.stdout.strip() == ("None" if given == "<unset>" else repr(given))


def test_without_a_gpu_it_says_so_in_one_line_and_exits_3(tmp_path):
    env = dict(__import__("os").environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(tmp_path / "gpu.md")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == gpu_check.NO_GPU == 3, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no CUDA GPU" in proc.stderr
    assert not (tmp_path / "gpu.md").exists()


@pytest.mark.skipif(not (H200 / "gpt2" / "scan.json").exists(), reason="the shared H200 runs are not here")
def test_the_h200_runs_give_the_issues_figures(tmp_path):
    """The first GPU runs (main 970466c): no kernel time in scan.json, the fit's peak equal to the allocator's, the
    scan at about 4x the bare profiler (the backend kernels are judged again by the code of today)."""
    work = tmp_path / "h200"
    for name in ("cnn", "gpt2", "logs"):
        shutil.copytree(H200 / name, work / name)
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--from", str(work), "--out", str(out)]) == 0
    text = out.read_text()
    assert "0.000 ms/step vs 27.778 ms of kernels" in text
    assert "GPT-2 small: backend kernels unsupported / cpu-fallback / unknown at torch_npu 2.14.0 |" in text
    assert "5,507,750,400 vs 5,506,832,896 B (1.0002)" in text
    assert "plain 24.1; bare profiler 48.3 CPU, 53.3 CPU+CUDA; scan 222.8" in text


@pytest.mark.skipif(not (H200 / "cnn" / "traces").is_dir(), reason="the shared H200 runs are not here")
@pytest.mark.parametrize("model", ["cnn", "gpt2"])
def test_the_scans_event_path_meets_the_checks_kernel_rows_on_the_h200_traces(tmp_path, model):
    """The H200 traces replayed through the scan's own event path (tests/kineto_trace.py) give the operators the
    check's kernel rows ask for: total device time within 5 % of the traces', no operator that launched a kernel
    without device time. What the `gpu` tests assert of a live GPU scan, checked here on recorded events."""
    pytest.importorskip("torch")
    from kineto_trace import kineto_events, load_trace

    from opscope.capture.events import calls_from_kineto, compact_calls

    run = tmp_path / model
    (run / "traces").mkdir(parents=True)
    operators, traces = [], []
    for step in (1, 2, 3):
        name = f"step_{step:04d}.json.gz"
        shutil.copy(H200 / model / "traces" / name, run / "traces" / name)
        traces.append(f"traces/step_{step:04d}.json")          # as scan.json lists them (gzipped copies are read)
        calls = compact_calls(calls_from_kineto(kineto_events(load_trace(run / "traces" / name)), step, [], None,
                                                release=True))
        operators += [{"name": c.name, "device_time_us": c.device_time_us, "on_device": c.device == "device"}
                      for c in calls]
    (run / "scan.json").write_text(json.dumps({"operators": operators, "traces": traces}))
    total, silent = gpu_check.kernel_rows(model, run)
    assert total.met is True, total.measured
    assert silent.met is True, silent.measured
