"""`opscope scan --mode fake`: data-dependent places with their lines, and equivalence with a real scan."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, load_scan, run_opscope

NANOGPT_ARGS = ["--device", "cpu", "--dtype", "float32", "--compile", "0", "--max_iters", "3",
                "--eval_interval", "100"]


def _line(script: Path, text: str) -> str:
    lines = script.read_text().splitlines()
    return f"{script.name}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def test_item_early_stopping_and_boolean_masks_scan_in_fake_mode(tmp_path):
    script = SCRIPTS / "fake_item_early_stop.py"
    proc = run_opscope("scan", script, "--steps", "3", "--mode", "fake", "--out", tmp_path, "--format", "html,xlsx")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert scan["complete"] and scan["settings"]["mode"] == "fake"
    places = {(p["kind"], p["where"]) for p in scan["fake_mode"]["places"]}
    assert ("data-dependent-size", _line(script, "kept = logits[confident]")) in places
    assert ("data-dependent-size", _line(script, "y[confident]")) in places
    assert ("bool-read", _line(script, "torch.isfinite(loss)")) in places
    assert ("value-read", _line(script, "value = loss.item()")) in places
    assert ("checkpoint-save", _line(script, "torch.save(")) in places   # nothing written for a fake model
    assert not (tmp_path / "checkpoint.pt").exists() and not (ROOT / "checkpoint.pt").exists()
    # the isfinite check reads True (a healthy run), so every step trained: 3 complete steps
    assert sum(1 for s in scan["steps"] if s["complete"]) == 3
    assert all(op["self_time_us"] == 0 for op in scan["operators"])
    assert scan["summary"]["time_basis"] == "not measured in fake mode"
    html = (tmp_path / "report.html").read_text()
    assert 'id="memory-fit-table"' in html and _line(script, "y[confident]") in html
    assert "not measured in fake mode" in html
    import openpyxl
    book = openpyxl.load_workbook(tmp_path / "report.xlsx")
    assert {"Memory fit", "Fake mode"} <= set(book.sheetnames)
    import opscope
    layouts = opscope.load(tmp_path).memory_fit
    assert list(layouts["layout"])[0] == "single card" and list(layouts["cards"])[0] == 1
    fit = scan["memory_fit"]
    parts = fit["parts"]   # each part at its largest: their sum bounds the measured peak from above
    assert parts["parameters"] + parts["optimizer_state"] <= fit["peak_bytes"] <= sum(parts.values())
    assert parts["optimizer_state"] > 0
    terminal = " ".join(proc.stdout.split())   # the summary, rich-wrapped
    assert "not measured in fake mode" in terminal
    assert _line(script, "value = loss.item()") in terminal


def _signatures(scan: dict, ignore: set) -> set:
    from opscope.knowledge import load
    unsure = load("fake_mode.yaml")["known_dtype_differences"]
    out = set()
    for op in scan["operators"]:
        if not op["top_level"] or op["name"] in ignore:
            continue
        dtypes = list(op["dtypes"])
        for i in (unsure.get(op["name"]) or {}).get("positions", []):
            if i < len(dtypes):
                dtypes[i] = "?"
        for phase in set(op["phases"] or [op["phase"]]) - {"other"}:   # set-up initialises fake parameters
            for src in op["sources"] or [op["source"]]:
                out.add((op["name"], json.dumps(op["input_shapes"]), json.dumps(dtypes), phase, src))
    return out


def test_fake_scan_matches_a_real_scan_of_the_cnn_example(tmp_path):
    from opscope.knowledge import load
    scans = {}
    for mode in ("real", "fake"):
        proc = run_opscope("scan", ROOT / "examples" / "train_cnn.py", "--steps", "3", "--mode", mode, "--out",
                           tmp_path / mode, "--format", "", "-q", "--", "--epochs", "1", "--samples", "256")
        assert proc.returncode == 0, proc.stderr[-2000:]
        scans[mode] = load_scan(tmp_path / mode)
    ignore = set(load("fake_mode.yaml")["known_differences"])
    real, fake = _signatures(scans["real"], ignore), _signatures(scans["fake"], ignore)
    assert len(real) > 40 and real == fake, (sorted(real - fake)[:10], sorted(fake - real)[:10])
    assert [r["source"] for r in scans["real"]["root_causes"]] == [r["source"] for r in scans["fake"]["root_causes"]]


def _real_peak_bytes(script: Path, argv: list) -> int:
    """Peak live tensor bytes of a plain run of the script, from the profiler's memory events."""
    code = ("import runpy, sys\nfrom torch.autograd.profiler import profile\n"
            "sys.argv = sys.argv[1:]\n"
            "with profile(profile_memory=True, use_kineto=True) as prof:\n"
            "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "live = peak = 0\n"
            "for e in sorted(prof.kineto_results.events(), key=lambda e: e.start_ns()):\n"
            "    if e.name() == '[memory]':\n"
            "        live += e.nbytes(); peak = max(peak, live)\n"
            "print(peak)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(script), *argv], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_fake_scan_matches_a_real_scan_of_a_small_gpt(tmp_path):
    from opscope.knowledge import load
    script = SCRIPTS / "nanogpt_style.py"
    scans = {}
    for mode in ("real", "fake"):
        out = tmp_path / mode
        proc = run_opscope("scan", script, "--steps", "3", "--mode", mode, "--out", out, "--format", "", "-q",
                           "--", *NANOGPT_ARGS)
        assert proc.returncode == 0, proc.stderr[-2000:]
        scans[mode] = load_scan(out)
    ignore = set(load("fake_mode.yaml")["known_differences"])
    real, fake = _signatures(scans["real"], ignore), _signatures(scans["fake"], ignore)
    assert len(real) > 50
    assert real == fake, (sorted(real - fake)[:10], sorted(fake - real)[:10])
    roots = {mode: sorted((r["source"], r["kind"]) for r in scans[mode]["root_causes"]) for mode in scans}
    assert roots["real"] == roots["fake"]
    fit = scans["fake"]["memory_fit"]
    measured = _real_peak_bytes(script, NANOGPT_ARGS)
    assert abs(fit["peak_bytes"] - measured) <= 0.15 * measured, (fit["peak_bytes"], measured)
    assert fit["fits_one_card"] and fit["parts"]["optimizer_state"] == 2 * fit["parts"]["parameters"]


def test_auto_runs_the_small_cnn_for_real(tmp_path):
    proc = run_opscope("scan", ROOT / "examples" / "train_cnn.py", "--mode", "auto", "--steps", "2", "--out", tmp_path,
                       "--format", "", "--", "--epochs", "1", "--samples", "256")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--mode auto chose real" in " ".join(proc.stderr.split())
    scan = load_scan(tmp_path)
    assert "within" in scan["settings"]["mode_auto"] and scan["fake_mode"] is None
    assert any(op["self_time_us"] > 0 for op in scan["operators"])   # a real run keeps its timings


@pytest.mark.slow
def test_auto_chooses_fake_for_a_llama_2_7b_configuration():
    from opscope.mode_probe import choose_mode
    mode, why = choose_mode(ROOT / "bench" / "scripts" / "llama_train.py", [], None)
    assert mode == "fake", why
    # 6.74e9 parameters in fp32 are ~25 GiB; with gradients and AdamW's two moments four times that
    params = float(why.split("parameters ")[1].split(" GiB")[0])
    assert 24.5 < params < 25.5 and "AdamW" in why


def test_memory_fit_cards_follow_the_sharding_arithmetic():
    from opscope.analysis.npu.memory_fit import GIB, memory_fit
    P, A = 25 * GIB, 40 * GIB
    step = {"bytes": 4 * P + A, "breakdown": {"parameters": P, "gradients": P, "optimizer_state": 2 * P,
                                             "activations": A},
            "end_breakdown": {"parameters": P, "gradients": 0, "optimizer_state": 2 * P, "activations": 0},
            "phase": "backward", "where": "train.py:10", "module": "layers.0.mlp", "step": 2}
    fit = memory_fit({"steps": [step]}).to_dict()   # as scan.json holds it
    assert not fit["fits_one_card"] and fit["peak_where"] == "train.py:10"
    cap = fit["capacity_bytes"]
    for layout, per_card in (("zero1", lambda n: 2 * P + 2 * P / n + A), ("zero3", lambda n: 4 * P / n + A),
                             ("tensor_parallel", lambda n: (4 * P + A) / n)):
        n = fit["cards"][layout]["cards"]
        if n is None:   # params + grads + activations alone exceed a card: no ZeRO-1 layout fits
            assert 2 * P + A > cap
        else:
            assert per_card(n) <= cap and (n == 1 or per_card(n // 2) > cap)


def test_data_dependent_sizes_get_their_bound_and_are_listed(tmp_path):
    script = SCRIPTS / "fake_data_dependent_ops.py"
    proc = run_opscope("scan", script, "--steps", "3", "--mode", "fake", "--out", tmp_path, "--format", "", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    places = {(p["op"], p["where"]): p for p in load_scan(tmp_path)["fake_mode"]["places"]}
    for op, text in (("aten::nonzero", "torch.nonzero(out > 0)"), ("aten::masked_select", "torch.masked_select"),
                     ("aten::_unique2", "classes = torch.unique"), ("aten::_unique2", "return_counts=True"),
                     ("aten::_local_scalar_dense", "means = out.mean(0).tolist()"), ("aten::_local_scalar_dense", "total = int(out.sum())"),
                     ("aten::any", "while (loss > 10).any()")):
        assert (op, _line(script, text)) in places, (op, text, sorted(places))
    # 3 steps, each read 8 means back with .tolist(); the tensor-conditioned loop ended (placeholder False)
    assert places[("aten::_local_scalar_dense", _line(script, "means = out.mean(0).tolist()"))]["count"] == 24
    assert places[("aten::any", _line(script, "while (loss > 10).any()"))]["value"] is False
    # the upper bound: 16 x 8 outputs -> 128 selected elements, printed by the script itself
    assert "torch.Size([128, 2]) torch.Size([128])" in proc.stdout


def transformers_env(folder: Path) -> dict:
    """An environment in which transformers imports: torchvision's CUDA-built extension does not load next
    to the CPU torch here, so a sitecustomize gives it opscope's CPU nms first (``opscope.fleet.tv_compat``,
    as generated fleet jobs do)."""
    import importlib.util
    import os
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text("try:\n    from opscope.fleet.tv_compat import import_torchvision\n"
                                             "    import_torchvision()\nexcept Exception:\n    pass\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))


@pytest.mark.slow
def test_transformers_llama_from_config_scans_fake_like_real(tmp_path):
    env = transformers_env(tmp_path / "site")
    script = SCRIPTS / "hf_llama_tiny.py"
    scans = {}
    for mode in ("real", "fake"):
        proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(script), "--steps", "3", "--mode", mode,
                               "--out", str(tmp_path / mode), "--format", "", "-q"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        scans[mode] = load_scan(tmp_path / mode)
    from opscope.knowledge import load
    ignore = set(load("fake_mode.yaml")["known_differences"])
    real, fake = _signatures(scans["real"], ignore), _signatures(scans["fake"], ignore)
    assert len(real) > 100 and real <= fake, sorted(real - fake)[:10]
    roots = {mode: sorted((r["source"], r["kind"]) for r in scans[mode]["root_causes"]) for mode in scans}
    assert roots["real"] == roots["fake"] and roots["fake"]
    # the padding line (a batch as long as its longest sequence) is among them
    assert (_line(script, "ids = torch.zeros(args.batch_size, longest"), "factory") in roots["fake"]


def test_ddp_script_scans_fake_with_its_gradient_all_reduce_recorded(tmp_path):
    import runpy
    script = SCRIPTS / "ddp_torchrun_train.py"
    proc = run_opscope("scan", script, "--mode", "fake", "--steps", "2", "--out", tmp_path, "--format", "", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    scan = load_scan(tmp_path)
    assert scan["complete"] and scan["settings"]["distributed"]["launcher"] == "torchrun"
    model = runpy.run_path(str(script), run_name="not_main")["build_model"]()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    (reduce,) = [c for c in scan["fake_mode"]["collectives"] if c["op"].startswith("all_reduce")]
    assert reduce["where"] == _line(script, "model = DDP(") and reduce["bytes"] == grad_bytes
    assert reduce["count"] == 2   # one gradient all-reduce per captured step


def test_fake_scan_finds_the_real_scans_dynamic_shape_root_causes(tmp_path, dynamic_scan):
    """examples/train_dynamic.py: a partial last batch, variable lengths, masks, nonzero, masked_select."""
    proc = run_opscope("scan", ROOT / "examples" / "train_dynamic.py", "--mode", "fake", "--steps", "6", "--out",
                       tmp_path, "--format", "", "-q", "--", "--samples", "70", "--batch-size", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    fake, real = load_scan(tmp_path), load_scan(dynamic_scan)
    roots = {name: sorted((r["source"], r["kind"]) for r in scan["root_causes"]) for name, scan in
             (("real", real), ("fake", fake))}
    assert roots["fake"] == roots["real"] and len(roots["real"]) >= 3
    # each data-dependent root on fake inputs is also listed as a place where a policy applied
    places = {p["where"] for p in fake["fake_mode"]["places"] if p["kind"] == "data-dependent-size"}
    assert places and places <= {source for source, kind in roots["real"] if kind == "data-dependent-output"}
