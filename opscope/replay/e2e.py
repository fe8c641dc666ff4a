"""End-to-end pass: the script's first N steps on the CPU and on the device, same seed.

Both runs go through the capture child (``opscope.capture.runner.run_script``) with the
``loss_plugin``, which seeds Python/NumPy/torch and records the loss per step.  The CPU
run uses the scan's CUDA->CPU remap, so an unmodified GPU script runs there too.  With
``--device cpu`` the candidate is a second CPU run: the pass then checks that the step
results reproduce from the seed (the precondition for comparing devices at all).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from opscope.analysis.verify import compare_losses
from opscope.capture.loss_plugin import FILE_NAME, SEED_ENV

PLUGIN = "opscope.capture.loss_plugin:install"
OK_KINDS = ("finished", "steps-reached")


def _run(script, argv, out: Path, device: str, steps: int, seed: int, timeout, console, label: str) -> dict:
    from opscope.capture.protocol import ScanPlan
    from opscope.capture.runner import run_script
    env = {SEED_ENV: str(seed), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    (out / FILE_NAME).unlink(missing_ok=True)
    started = time.perf_counter()
    status = console.status(f"e2e {label} run on {device}: step 0/{steps}") if console else None
    if status is not None:
        status.start()
    try:
        plan = ScanPlan(script=str(script), argv=tuple(argv), out_dir=str(out), steps=steps, device=device, timeout=timeout,
                        plugins=(PLUGIN,), export_traces=False, analyse=False, static=False)
        outcome = run_script(plan, env=env, progress=(lambda n: status.update(f"e2e {label} run on {device}: step {n}/{steps}"))
                             if status is not None else None)
    finally:
        if status is not None:
            status.stop()
    try:
        losses = json.loads((out / FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        losses = {"loss": [], "grad_norm": []}
    return {"device": device, "outcome": outcome.kind, "message": outcome.message, "where": outcome.where,
            "steps": len(losses.get("loss", [])), "seconds": round(time.perf_counter() - started, 2),
            "dir": str(out), "losses": losses}


def run_e2e(script: str, argv: list[str], out: Path, device: str, steps: int, seed: int = 0,
            rtol: float = 1e-2, atol: float = 1e-3, timeout: float | None = None, console=None) -> dict:
    """Run both passes and compare; writes ``out/e2e.json`` and returns the same dict."""
    from opscope.errors import UserError
    script_path = Path(script)
    if not script_path.is_file():
        raise UserError(f"--e2e: script not found: {script} (check the path; script arguments go after `--`)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    reference = _run(script, argv, out / "reference", "cpu", steps, seed, timeout, console, "reference")
    candidate = _run(script, argv, out / "candidate", device, steps, seed, timeout, console, "candidate")
    comparison = compare_losses(reference["losses"], candidate["losses"], rtol=rtol, atol=atol)
    broken = [r for r in (reference, candidate) if r["outcome"] not in OK_KINDS]
    if broken:
        first = broken[0]
        comparison["verdict"] = "error"
        comparison["message"] = (f"the {first['device']} run ended early ({first['outcome']}: "
                                 f"{first['message'] or 'no message'}"
                                 f"{' at ' + first['where'] if first.get('where') else ''})")
    elif min(reference["steps"], candidate["steps"]) < steps and comparison["verdict"] == "pass":
        comparison["verdict"] = "warn"
        comparison["message"] += f"; only {min(reference['steps'], candidate['steps'])} of {steps} steps ran"
    same = device == "cpu"
    result = {
        "script": str(script_path.resolve()), "argv": list(argv), "steps": steps, "seed": seed,
        "reference_device": "cpu",
        "candidate": "cpu (second run)" if same else device,
        "compared": ("two CPU runs from the same seed: checks that step results reproduce" if same else
                     f"CPU run vs {device} run from the same seed and the same host-generated batches"),
        "runs": {"reference": reference, "candidate": candidate},
        "comparison": comparison,
    }
    (out / "e2e.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    return result
