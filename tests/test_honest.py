"""Reports say what a scan can stand on: a failed scan has no verdict, an incomplete one says how
many steps it measured, and no report claims "nothing to change" for a run it did not see."""
from __future__ import annotations

import json
import re

import pytest

from conftest import SCRIPTS, load_scan, run_opscope

CLEAN_CLAIMS = ("Nothing to change", "every operator seen runs on the NPU", "Nothing to fix")


def _scan(tmp_path, script, *script_args):
    proc = run_opscope("scan", SCRIPTS / script, "--steps", "5", "--out", tmp_path, "--format", "html,md,xlsx",
                       "--", *script_args)
    return proc, load_scan(tmp_path)


def _html_headline(out) -> str:
    html = (out / "report.html").read_text(encoding="utf-8")
    line = re.search(r'<p class="verdict-line" id="verdict-line">(.*?)</p>', html, re.S).group(1)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", line)).strip()


def _xlsx_verdict(out) -> str:
    from openpyxl import load_workbook
    rows = {r[0]: r[1] for r in load_workbook(out / "report.xlsx")["Summary"].iter_rows(values_only=True)}
    return rows["verdict"]


@pytest.mark.parametrize("script, args, why", [
    ("crash_at_step3.py", ["--fail-at", "1"], "RuntimeError: bad batch at step 1"),
    ("trains_nothing.py", [], "no training iteration completed"),
])
def test_failed_scan_headlines_say_it_failed_everywhere(tmp_path, script, args, why):
    proc, scan = _scan(tmp_path, script, *args)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert scan["summary"]["readiness_score"] is None
    terminal = proc.stdout
    headline = _html_headline(tmp_path)
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    for text in (terminal, headline, markdown, _xlsx_verdict(tmp_path)):
        assert "Scan failed — no verdict" in text and why in text
        assert not any(claim in text for claim in CLEAN_CLAIMS), text
    assert not re.search(r"\bNone\b", terminal), terminal
    assert "no score (n/a)" in terminal
    assert headline.startswith("n/a Scan failed") and "/100" not in headline
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert not any(claim in html for claim in CLEAN_CLAIMS)
    # no step time or FPS priced from a step that never finished; `report` does not price it either
    assert scan["npu_estimate"] is None and "samples/s" not in terminal
    assert "NPU time estimate not computed: no training iteration completed" in scan["notes"]
    again = run_opscope("report", tmp_path, "--format", "json")
    assert again.returncode == 0 and json.loads((tmp_path / "scan.json").read_text())["npu_estimate"] is None


def test_incomplete_scan_says_how_many_steps_it_measured(tmp_path):
    proc, scan = _scan(tmp_path, "exit_nonzero.py")  # one whole step, then sys.exit(2)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert sum(1 for s in scan["steps"] if s["complete"]) == 1
    for text in (proc.stdout, _html_headline(tmp_path), (tmp_path / "report.md").read_text(encoding="utf-8"),
                 _xlsx_verdict(tmp_path)):
        assert "Incomplete — 1 step measured" in text and "exited with status 2" in text
        assert not any(claim in text for claim in CLEAN_CLAIMS), text
    assert not re.search(r"\bNone\b", proc.stdout)


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """A tiny ViT (fused attention, AdamW) scanned as a user would: terminal output and reports."""
    out = tmp_path_factory.mktemp("vit")
    proc = run_opscope("scan", SCRIPTS / "vit_tiny.py", "--steps", "2", "--out", out, "--format", "html,md",
                       "--", "--steps", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_cpu_backend_kernels_are_judged_as_the_public_op_they_implement(vit_run):
    """A ViT's fused attention: the CPU runs SDPA's backward as its own `_for_cpu_backward` kernel,
    straight from the autograd node; that is SDPA's backward, not a CPU fallback."""
    scan = load_scan(vit_run[0])
    ops = {op["name"]: op for op in scan["operators"]}
    backward = ops["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    public = ops["aten::scaled_dot_product_attention"]
    assert backward["phase"] == "backward" and backward["parent"] is None  # no public parent to fold into
    assert backward["verdict"] == public["verdict"] == "native"
    assert backward["evidence"]["rule"] == "backend-implements"
    assert backward["evidence"]["implements"] == "aten::scaled_dot_product_attention"
    assert backward["evidence"]["part"] == "backward"
    assert not [o["op"] for o in scan["summary"]["blocking_ops"] if "scaled_dot_product" in o["op"]]
    assert "cpu-fallback" not in {op["verdict"] for op in scan["operators"]}


def test_every_cpu_only_for_cpu_kernel_names_its_public_op():
    """Data completeness: each CPU-only `*_for_cpu*` kernel in the matrix's torch facts is mapped."""
    from opscope.knowledge import implemented_public_op
    from opscope.resources import support_matrix_dir
    facts = (support_matrix_dir() / "versions" / "torch_schema.txt").read_text(encoding="utf-8")
    kernels = set(re.findall(r"^op (\w*_for_cpu\w*) d=CPU$", facts, re.M))
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in kernels
    for name in kernels:
        public = implemented_public_op(f"aten::{name}")
        assert public is not None, name
        assert f"op {public[0].removeprefix('aten::')} " in facts or f"op {public[0].removeprefix('aten::')}\n" in facts


def test_upstream_numeric_mismatch_is_one_evidence_line_per_family_not_a_fix(vit_run):
    """float32 upstream test failures touch nearly every scan: evidence pointing at `opscope verify`,
    one line per operator family, never a row of the what-to-change list."""
    out, proc = vit_run
    from opscope.model import ScanResult
    from opscope.report import view
    result = ScanResult.from_dict(load_scan(out))
    checks = view.numeric_checks(result)
    families = [c.family for c in checks]
    assert "addmm" in families and len(families) == len(set(families))
    assert not [f for f in view.top_fixes(result, limit=None) if "numeric mismatch" in f.what or f.kind == "dtype"]
    terminal = proc.stdout
    fixes_part = terminal.split("Numerics to check", 1)[0]
    assert "numeric mismatch" not in fixes_part  # not in the what-to-change table above it
    assert f"opscope verify {out} --device npu".replace(" ", "") in "".join(terminal.split())
    shown = [ln for ln in terminal.splitlines() if "upstream test_compare_cpu fails" in ln]
    assert len(shown) == min(5, len(checks)) and shown[0].strip().startswith(checks[0].what)
    if len(checks) > 5:
        assert f"+{len(checks) - 5} more operator families" in terminal
    markdown = (out / "report.md").read_text(encoding="utf-8")
    top = markdown.split("## Top things to fix", 1)[1].split("##", 1)[0]
    assert "numeric mismatch" not in top and "## Numerics to check" in markdown
    assert markdown.count("upstream test_compare_cpu fails") == len(checks)
    html = (out / "report.html").read_text(encoding="utf-8")
    section = html.split('<section id="numerics">', 1)[1].split("</section>", 1)[0]
    assert section.count("upstream test_compare_cpu fails") == len(checks) and "opscope verify" in section
    assert "numeric mismatch" not in html.split('<section id="fixes">', 1)[1].split("</section>", 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize("launch", [[], ["--launcher", "torchrun", "--world-size", "2"]], ids=["one-process", "torchrun"])
def test_profiler_noise_is_kept_off_stderr_and_noted_while_the_script_keeps_its_own(tmp_path, launch):
    """opscope pauses recording after a few evaluation forwards; each pause makes Kineto print a
    "Toggling CPU activity" line (prefixed `[rank0]:` once a process group exists)."""
    proc = run_opscope("scan", SCRIPTS / "noisy_eval.py", "--steps", "3", "--out", tmp_path, "--format", "", *launch)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Toggling" not in proc.stderr and "profiler_kineto" not in proc.stderr
    assert "UserWarning: noisy_eval: learning rate schedule not set" in proc.stderr   # the script's warning
    assert "noisy_eval: step 1 held-out score" in proc.stderr                         # and its own log lines
    notes = [n for n in load_scan(tmp_path)["notes"] if n.startswith("kept off your terminal")]
    assert len(notes) == 1 and "Toggling CPU activity" in notes[0]
    assert int(re.search(r"terminal: (\d+) x", notes[0]).group(1)) >= 2   # one pause and resume per step


def test_relay_counts_profiler_lines_and_passes_the_script_lines(tmp_path, monkeypatch):
    import io
    import sys

    from opscope.capture.noise import notes
    from opscope.capture.processes import relay_stderr
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", type("S", (), {"buffer": out})())
    toggle = b"[W1125 17:18:52.242513517 profiler_kineto.cpp:814] Toggling CPU activity with GPU activity on\n"
    relay_stderr(io.BytesIO(b"[rank0]:" + toggle + toggle + b"[rank0]: my own warning\n"
                             b"USDT:2026-11-25 17:18:52 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"),
                  tmp_path)
    assert out.getvalue() == b"[rank0]: my own warning\n"
    kept = notes(tmp_path)
    assert len(kept) == 1 and kept[0].startswith("kept off your terminal: 2 x Kineto")  # start/stop: counted, no note


def test_a_profiler_line_after_a_progress_bar_is_kept_off_and_the_bar_passes(tmp_path, monkeypatch):
    """tqdm (HF Trainer, Lightning) redraws with a carriage return and no newline, so the profiler's
    stop line lands on the bar's line."""
    import io
    import sys

    from opscope.capture.processes import relay_stderr
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stderr", type("S", (), {"buffer": out})())
    bar = "\r 20%|██        | 1/5 [00:00<00:01,  3.61it/s]".encode()
    stop = b"USDT:2026-11-25 18:12:04 22543:22543 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
    relay_stderr(io.BytesIO(bar + stop + b"[rank0]:" + stop + b"step 3 done\n"), tmp_path)
    assert out.getvalue() == bar + b"step 3 done\n"
    out.truncate(0), out.seek(0)
    quoted = b"my log quotes USDT:2026-11-25 18:12:04 1:1 A.cpp:59] profiler_stop\n"   # no bar: the script's line
    relay_stderr(io.BytesIO(quoted), tmp_path)
    assert out.getvalue() == quoted


def test_warnings_raised_inside_opscope_go_to_notes_and_the_scripts_pass(tmp_path, monkeypatch):
    import warnings

    import opscope.capture.ranks as ranks
    from opscope.capture.noise import divert_own_warnings, notes
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *args, **kwargs: shown.append(args[0]))
    divert_own_warnings(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit("`torch.distributed._foo` is deprecated", FutureWarning, ranks.__file__, 52)
        warnings.warn_explicit("the script's own", UserWarning, str(SCRIPTS / "noisy_eval.py"), 13)
    assert [str(m) for m in shown] == ["the script's own"]
    (note,) = notes(tmp_path)
    assert note.startswith("kept off your terminal: 1 x FutureWarning raised inside opscope")
    assert "opscope/capture/ranks.py:52" in note


def test_drop_last_is_not_advised_for_a_validation_loader_nor_as_a_cuda_api(tmp_path):
    """A GPU-style trainer: full training batches (drop_last=True), a validation loader whose last
    batch is smaller.  The run shows the training step's shapes never change, so no drop_last advice;
    the static guess (a DataLoader without drop_last) is not a CUDA-API fix of a scan."""
    proc = run_opscope("scan", SCRIPTS / "train_with_validation.py", "--steps", "9", "--out", tmp_path, "--quiet",
                       "--format", "md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert "epoch 1 val accuracy" in proc.stdout   # the validation loop ran, last batch of 2 included
    assert not [f for f in scan["findings"] if f["rule"] == "drop-last"]
    assert not any("drop_last" in (f.get("replacement") or "") for f in scan["findings"])
    assert not any("drop_last" in rc["suggestion"] for rc in scan["root_causes"])
    assert "drop_last" not in (tmp_path / "report.md").read_text(encoding="utf-8")
    # --static-only keeps its guess: nothing ran to judge it
    static = run_opscope("scan", "--static-only", SCRIPTS / "train_with_validation.py", "--out", tmp_path / "s",
                         "--quiet")
    assert static.returncode == 0 and "drop-last" in (tmp_path / "s" / "findings.json").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_host_batch_stacked_then_moved_to_the_device_is_data_preparation(tmp_path):
    """nanoGPT's get_batch: `torch.stack` of CPU slices, then `.to(device)`.  That stack (and the
    slices it stacks) is host work, judged apart from the device's own `torch.stack` (grad norms)."""
    proc = run_opscope("scan", SCRIPTS / "nanogpt_style.py", "--steps", "3", "--out", tmp_path, "--quiet",
                       "--format", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops = load_scan(tmp_path)["operators"]

    def at(name, line):
        return [o for o in ops if o["name"] == name and any(s.endswith(f":{line}") for s in o["sources"])]

    batch = at("aten::stack", 95)
    assert len(batch) == 1 and set(batch[0]["sources"]) == {"nanogpt_style.py:95", "nanogpt_style.py:96"}
    assert batch[0]["phases"] == ["other"] and batch[0]["on_device"] is False
    assert batch[0]["verdict"] == "not-applicable" and batch[0]["evidence"]["rule"] == "host-tensors"
    assert all(o["verdict"] == "not-applicable" for o in at("aten::slice", 95))
    device_stack = [o for o in ops if o["name"] == "aten::stack" and o is not batch[0]]
    assert device_stack and all(o["on_device"] and "other" not in o["phases"] for o in device_stack)
    embedding = [o for o in ops if o["name"] == "aten::embedding"]
    assert embedding and all(o["on_device"] and o["verdict"] == "native" for o in embedding)  # the batch's consumer


def test_a_validation_loaders_smaller_last_batch_gets_the_evaluation_fix_not_drop_last(tmp_path):
    """The held-out set's last batch (2 of 4) changes the shapes of the evaluation forwards only:
    the root cause is found at the validation loader, with a fix that keeps every sample."""
    proc = run_opscope("scan", SCRIPTS / "validate_every_step.py", "--steps", "6", "--out", tmp_path, "--quiet",
                       "--format", "")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    (rc,) = scan["root_causes"]
    assert rc["source"] == "validate_every_step.py:10" and rc["kind"] == "partial-batch"
    assert "drop_last" not in rc["suggestion"] and "Keep every sample" in rc["suggestion"]
    assert "never a backward pass" in rc["evidence"]
    mine = [d for d in scan["dynamic_shapes"] if d["root_cause"] == rc["source"]]
    assert mine and not any("drop_last" in d["suggestion"] for d in mine)


def test_the_terminal_never_prints_none_for_missing_fields():
    """A scan.json written by an interrupted or older scan: missing reasons, lines and scores read as
    what they are, never as Python's None."""
    import io

    from rich.console import Console

    from opscope.model import Finding, RootCause, ScanResult
    from opscope.report.terminal import print_summary
    result = ScanResult(script="train.py", complete=False, incomplete_reason=None,
                        summary={"readiness_score": None}, target={"version": "2.14.0"},
                        findings=[Finding(rule="cuda-call", file=None, line=None, api="Tensor.cuda()", message="m",
                                          remapped_to="a no-op")],
                        root_causes=[RootCause(source=None, cause="input-varies", ops=["aten::mm"])])
    buf = io.StringIO()
    print_summary(result, Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    assert not re.search(r"\bNone\b", text), text
    assert "Scan failed — no verdict for torch_npu 2.14.0" in text and "no score (n/a)" in text


def test_noise_notes_never_fail_a_scan_on_an_unwritable_folder(tmp_path):
    from opscope.capture.noise import Noise
    noise = Noise(tmp_path / "missing" / "capture")   # cannot be written: no such folder
    assert noise.profiler_line(b"[rank1]:[W1125 17:18:52.242513517 profiler_kineto.cpp:814] Toggling CPU\n")
    assert not noise.profiler_line(b"Toggling my own feature flag\n")
    noise.save()   # no exception: the notes are best effort


def test_crash_in_step_one_blames_the_crash_not_the_step_marker(tmp_path):
    """A script that raises inside its first iteration: the step marker is not the suspect, and a note
    about DataLoader workers it never had is not said either."""
    proc = run_opscope("scan", SCRIPTS / "crash_at_step3.py", "--steps", "3", "--out", tmp_path, "--format", "",
                       "--", "--fail-at", "1")
    assert proc.returncode == 3, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert "RuntimeError: bad batch at step 1" in proc.stderr
    assert "no training iteration completed before the script stopped" in scan["summary"]["score_unavailable"]
    said = [proc.stdout, proc.stderr, scan["summary"]["score_unavailable"], *scan["notes"]]
    assert not any("--step-marker" in text for text in said), said
    assert not any("DataLoader worker" in note for note in scan["notes"]), scan["notes"]


def test_dataloader_worker_note_only_when_the_loader_has_workers(tmp_path):
    proc = run_opscope("scan", SCRIPTS / "loader_workers.py", "--steps", "3", "--out", tmp_path, "--format", "", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any("DataLoader worker processes are not profiled" in note for note in load_scan(tmp_path)["notes"])
