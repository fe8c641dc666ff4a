"""`opscope scan` on scripts written the way real training code is (issue: real launches).

Each script under tests/data/scripts/ follows a public idiom: manual SGD with bptt slicing,
a nanoGPT-style trainer (torch.compile, autocast, GradScaler, pinned copies), an LBFGS
closure, a char-GPT with a sampling callback, torch.accelerator, a script that trains
nothing, a first step that never ends.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SCRIPTS, load_scan, run_opscope

def _lines(script: str) -> list[str]:
    return (SCRIPTS / script).read_text().splitlines()


def _line_of(script: str, text: str) -> int:
    return next(i for i, line in enumerate(_lines(script), start=1) if text in line)


def scan(tmp_path, script, *args, steps=3, extra=()):
    proc = run_opscope("scan", SCRIPTS / script, "--steps", steps, "--out", tmp_path, "--quiet", "--format", "",
                       *extra, "--", *args)
    return proc


def test_manual_sgd_steps_are_whole_iterations(tmp_path):
    proc = scan(tmp_path, "lstm_lm_manual_sgd.py", steps=10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scan_json = load_scan(tmp_path)
    steps = scan_json["steps"]
    assert [s["index"] for s in steps] == list(range(1, 11)) and all(s["complete"] for s in steps)
    # every step holds one forward (the LSTM), one backward and the manual p.data update
    for s in steps:
        assert s["phase_time_us"]["forward"] > 0 and s["phase_time_us"]["backward"] > 0
        assert s["phase_time_us"]["optimizer"] > 0
    steady = {s["op_calls"] for s in steps[1:]}
    assert len(steady) == 1, steady   # identical iterations: the loss module call does not split them
    lstm = [op for op in scan_json["operators"] if op["name"] == "aten::lstm"]
    assert lstm and all(op["steps"] == list(range(1, 11)) for op in lstm)
    update = _line_of("lstm_lm_manual_sgd.py", "p.data.add_(p.grad")
    assert any(op["name"] == "aten::add_" and op["phase"] == "optimizer"
               and op["source"] == f"lstm_lm_manual_sgd.py:{update}" for op in scan_json["operators"])


def test_compiled_nanogpt_measures_the_eager_program(tmp_path):
    proc = scan(tmp_path, "nanogpt_style.py", steps=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recompile" not in proc.stderr.lower() and "dynamo" not in proc.stderr.lower()
    scan_json = load_scan(tmp_path)
    assert all(s["complete"] for s in scan_json["steps"]) and len(scan_json["steps"]) == 3
    assert not [op["name"] for op in scan_json["operators"] if not op["source"]]
    assert not [op for op in scan_json["operators"] if op["name"].startswith("prims::")]
    names = {op["name"] for op in scan_json["operators"]}
    assert {"aten::layer_norm", "aten::_scaled_dot_product_flash_attention_for_cpu"} & names
    findings = {(f["rule"], f["line"]): f for f in scan_json["findings"]}
    compile_line = _line_of("nanogpt_style.py", "model = torch.compile(model)")
    assert ("torch-compile", compile_line) in findings
    assert "torchair" in findings[("torch-compile", compile_line)]["replacement"]
    autocast_line = _line_of("nanogpt_style.py", "torch.amp.autocast(device_type=device_type")
    autocast = findings[("cuda-amp-autocast", autocast_line)]
    assert "cpu" in autocast["remapped_to"]
    pin_line = _line_of("nanogpt_style.py", "x.pin_memory().to(device, non_blocking=True)")
    assert ("pin-memory", pin_line) in findings and findings[("pin-memory", pin_line)]["remapped_to"]


def test_remaps_are_listed_in_terminal_and_html(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "nanogpt_style.py", "--steps", "2", "--out", tmp_path, "--format", "html",
                       "--", "--compile", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Remapped for this scan" in proc.stdout and "GradScaler('cpu')" in proc.stdout
    html = (tmp_path / "report.html").read_text()
    assert 'id="remaps-table"' in html and "GradScaler(&#39;cpu&#39;)" in html


def test_torch_accelerator_is_remapped_and_reported(tmp_path):
    proc = scan(tmp_path, "accelerator_api.py", steps=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scan_json = load_scan(tmp_path)
    assert len([s for s in scan_json["steps"] if s["complete"]]) == 3
    lines = {f["line"] for f in scan_json["findings"] if f["rule"] == "accelerator-api"}
    assert {_line_of("accelerator_api.py", "torch.accelerator.is_available()"),
            _line_of("accelerator_api.py", "current_accelerator()"),
            _line_of("accelerator_api.py", "torch.accelerator.synchronize()")} <= lines
    assert any(op["name"] == "aten::addmm" and op["phase"] == "forward" for op in scan_json["operators"])


def test_a_signature_the_training_step_runs_is_training_work_however_often_eval_ran_it():
    """nanoGPT's train.py evaluates (eval_iters batches per split) before its first step, on the
    training forward's own shapes: those signatures are forward, so the batch and FPS are found."""
    from opscope.analysis.aggregate import aggregate
    from opscope.model import OpCall
    mm = dict(name="aten::mm", input_shapes=[[256, 64], [64, 256]], dtypes=["float", "float"], source="model.py:88")
    calls = [OpCall(phase="eval", step=1, **mm) for _ in range(4)] + [OpCall(phase="forward", step=s, **mm)
                                                                       for s in (1, 2, 3)]
    calls += [OpCall(name="aten::topk", input_shapes=[[1, 65]], dtypes=["float"], phase="eval", step=1)] * 2
    phases = {op.name: (op.phase, op.phases) for op in aggregate(calls)}
    assert phases["aten::mm"] == ("forward", ["eval", "forward"])
    assert phases["aten::topk"] == ("eval", ["eval"])      # only evaluation runs it


def test_sampling_callback_is_labelled_eval_and_bounded(tmp_path):
    proc = scan(tmp_path, "char_gpt_sampling.py", "--sample-len", "60", "--sample-every", "1", steps=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scan_json = load_scan(tmp_path)
    steps = scan_json["steps"]
    assert len(steps) == 3 and all(s["complete"] for s in steps)
    # the sampled forwards run the model's own lines, labelled eval (not a training forward)
    first = _line_of("char_gpt_sampling.py", "def forward(self, idx):")
    last = _line_of("char_gpt_sampling.py", "return self.head(self.blocks(x, mask=mask, is_causal=True))")
    eval_ops = [op for op in scan_json["operators"] if op["phase"] == "eval"]
    assert eval_ops and all(first < int(op["source"].rsplit(":", 1)[1]) <= last for op in eval_ops)
    # 60 sampled tokens per step, of which only the first few forwards are recorded
    assert any(s["unrecorded"].get("eval_forwards", 0) >= 50 for s in steps[1:])
    assert any("ran unprofiled" in note and "'eval'" in note for note in scan_json["notes"])
    # training forwards are still forward, and the optimizer step ends each step
    assert any(op["phase"] == "forward" and op["name"] == "aten::linear" for op in scan_json["operators"])


def test_lbfgs_closure_step_is_captured_with_bounded_recording(tmp_path):
    proc = scan(tmp_path, "lbfgs_sequence.py", "--steps", "4", steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scan_json = load_scan(tmp_path)
    assert [s["complete"] for s in scan_json["steps"]] == [True, True]
    names = {op["name"] for op in scan_json["operators"]}
    assert {"aten::lstm_cell", "aten::mse_loss", "aten::mse_loss_backward"} <= names
    assert all(s["unrecorded"].get("closure_forwards", 0) >= 1 for s in scan_json["steps"])
    assert any("optimizer.step(closure)" in note for note in scan_json["notes"])


def test_script_that_trains_nothing_has_no_score_and_fails(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "trains_nothing.py", "--steps", "3", "--out", tmp_path, "--quiet",
                       "--format", "html", "--fail-under", "10")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "no training iteration completed" in proc.stderr and "Traceback" not in proc.stderr
    scan_json = load_scan(tmp_path)
    assert scan_json["summary"]["readiness_score"] is None
    assert "no training iteration" in scan_json["summary"]["score_unavailable"]
    assert scan_json["complete"] is False
    assert "readiness-score\">n/a" in (tmp_path / "report.html").read_text()


def test_timeout_inside_first_step_keeps_what_it_captured(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "slow_first_step.py", "--steps", "3", "--out", tmp_path, "--quiet",
                       "--format", "", "--timeout", "20")
    assert proc.returncode == 4, proc.stderr[-3000:]
    scan_json = load_scan(tmp_path)
    assert scan_json["summary"]["readiness_score"] is None
    wait_line = _line_of("slow_first_step.py", "time.sleep(0.1)")
    assert f"slow_first_step.py:{wait_line}" in scan_json["summary"]["score_unavailable"]
    names = {op["name"] for op in scan_json["operators"]}
    assert {"aten::conv2d", "aten::logsumexp"} <= names  # the forward of the unfinished step


def _alive(pattern: str) -> list[int]:
    """Processes (not pytest) whose command line or environment names ``pattern``: a capture child
    started early names no file on its command line, but inherits ``OPSCOPE_TEST_RUN``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
                environ = open(f"/proc/{entry}/environ", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if "pytest" not in cmdline and (pattern in cmdline or pattern in environ):
                pids.append(int(entry))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_opscope_stops_the_script_and_writes_results(tmp_path):
    proc, out = _start_scan(tmp_path, "--format", "html")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "SIGTERM" in err and "Traceback" not in err
    scan_json = load_scan(out)
    assert scan_json["complete"] is False and (out / "report.html").exists()
    time.sleep(0.5)
    assert not _alive(str(SCRIPTS / "hang_at_step2.py")), "the script outlived opscope"


def test_control_characters_in_the_error_text_never_break_the_reports(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "crash_ansi_error.py", "--steps", "4", "--out", tmp_path, "--quiet",
                       "--format", "html,xlsx,md")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Weights only load failed" in proc.stderr
    import openpyxl
    book = openpyxl.load_workbook(tmp_path / "report.xlsx")
    text = "\n".join(str(cell.value) for sheet in book for row in sheet.iter_rows() for cell in row
                     if cell.value is not None)
    assert "Weights only load failed" in text and "\x1b" not in text and "\x07" not in text
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Weights only load failed" in html and "\x1b" not in html


def _start_scan(tmp_path, *extra):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "scan", str(SCRIPTS / "hang_at_step2.py"),
                             "--steps", "5", "--out", str(out), "--quiet", "--format", "", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OPSCOPE_TEST_RUN=str(out)))   # names the run's processes
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "capture" / "steps.jsonl").exists():
        time.sleep(0.2)
    time.sleep(4)  # let step 1 run into the hang
    return proc, out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_opscope_leaves_no_child(tmp_path):
    proc, out = _start_scan(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive(str(SCRIPTS / "hang_at_step2.py")):
        time.sleep(0.5)
    assert not _alive(str(SCRIPTS / "hang_at_step2.py")), "the script outlived a SIGKILLed opscope"
    assert not _alive(f"OPSCOPE_TEST_RUN={out}"), "the capture child outlived opscope"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sighup_says_terminated_and_keeps_results(tmp_path):
    proc, out = _start_scan(tmp_path, "--format", "html")
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, err[-3000:]
    scan_json = load_scan(out)
    assert scan_json["incomplete_reason"].startswith("terminated by SIGHUP")
    assert (out / "report.html").exists() and "Traceback" not in err


def test_max_memory_stops_the_script_and_keeps_what_was_captured(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "memory_hog.py", "--steps", "5", "--out", tmp_path, "--quiet",
                       "--format", "", "--max-memory", "1200")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "--max-memory 1,200 MB" in proc.stderr and "Traceback" not in proc.stderr
    scan_json = load_scan(tmp_path)
    assert "more than --max-memory 1,200 MB" in scan_json["incomplete_reason"]
    assert [s["index"] for s in scan_json["steps"] if s["complete"]][:2] == [1, 2]
