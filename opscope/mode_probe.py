"""``opscope scan --mode auto``: fake when the model's parameters + gradients + optimizer state would not
fit in this machine's free memory.

The estimate comes from a probe: the script runs in fake mode (nothing is allocated for the
model) up to its model's first forward, where the parameters are known; gradients count
as much as the trainable parameters, optimizer state by optimizer class
(``optimizer_state_per_param`` in ``support_matrix/fake_mode.yaml``).  Activations are not
in the estimate (said so).
"""
from __future__ import annotations

import tempfile
from pathlib import Path


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def estimate(record: dict) -> tuple[int, int, str]:
    """(parameter bytes, params + grads + optimizer state bytes, optimizer named) from a probe's fake.json."""
    from opscope.knowledge import load
    per_param = load("fake_mode.yaml").get("optimizer_state_per_param") or {}
    params = int(((record.get("memory") or {}).get("current") or {}).get("parameters", 0))
    names = record.get("optimizers") or []
    factor = max((float(per_param.get(n, per_param.get("default", 2))) for n in names),
                 default=float(per_param.get("default", 2)))
    optimizer = ", ".join(names) if names else f"no optimizer built yet: assumed {factor:g}x state"
    return params, int(params * (2 + factor)), optimizer


def choose_mode(script: Path, argv: list, timeout: float | None) -> tuple[str, str]:
    """('fake' | 'real', why) for ``script``."""
    from opscope.capture.protocol import ScanPlan
    from opscope.capture.run_folder import RunFolder
    from opscope.capture.runner import run_script
    with tempfile.TemporaryDirectory(prefix="opscope-probe-") as tmp:
        run_script(ScanPlan(script=str(script), argv=tuple(argv), out_dir=tmp, steps=1, device="cpu", timeout=timeout,
                            export_traces=False, analyse=False, static=False, mode="probe"))
        record = RunFolder(Path(tmp)).read_fake()
    if not record or not ((record.get("memory") or {}).get("current") or {}).get("parameters"):
        return "real", "the probe saw no model parameters before the script ended (nothing to estimate)"
    params, need, optimizer = estimate(record)
    free = available_bytes()
    figures = (f"parameters {_size(params)}, + gradients + optimizer state ({optimizer}) = {_size(need)}, "
               "activations not included")
    if free is None:
        return "fake", f"{figures}; free memory unknown here"
    if need > free:
        return "fake", f"{figures}, more than the {_size(free)} free here"
    return "real", f"{figures}, within the {_size(free)} free here"


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
