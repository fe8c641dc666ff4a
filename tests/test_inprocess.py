"""The in-process API produces the same outputs as `opscope scan`."""
from __future__ import annotations

import subprocess
import sys

from conftest import load_scan

SCRIPT = '''
import torch, torch.nn as nn
import opscope

model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
with opscope.capture(out=OUT, steps=3, formats=()) as cap:
    for i in range(10):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        cap.step()
print("done", cap.done)
import opscope.capture.session  # importing a submodule must not shadow the callable API
assert callable(opscope.capture)
'''


def test_capture_context_manager_writes_scan(tmp_path):
    script = tmp_path / "train_inline.py"
    out = tmp_path / "run"
    script.write_text(f"OUT = {str(out)!r}\n" + SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done True" in proc.stdout
    scan = load_scan(out)
    assert scan["complete"] and [s["index"] for s in scan["steps"]] == [1, 2, 3]
    gelu = [op for op in scan["operators"] if op["name"] == "aten::gelu"]
    assert gelu and gelu[0]["source"].startswith("train_inline.py:")
    assert (out / "operators.csv").exists() and len(scan["traces"]) == 3


def test_capture_in_a_notebook_keeps_its_matplotlib_backend(tmp_path):
    """A notebook set to another backend stays on it: the report charts never call matplotlib.use."""
    script = tmp_path / "train_backend.py"
    out = tmp_path / "run"
    script.write_text("import matplotlib\nmatplotlib.use('pdf')\n"
                      + f"OUT = {str(out)!r}\n" + SCRIPT.replace("formats=()", "formats=('html',)")
                      + "import sys\nprint('backend', matplotlib.get_backend(), 'pyplot' in str(list(sys.modules)))\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "backend pdf False" in proc.stdout  # unchanged, and pyplot never imported
    assert "<img" in (out / "report.html").read_text()  # the charts were drawn all the same


GUARDED = '''
import torch, torch.nn as nn
import opscope

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with opscope.capture(out=OUT, steps=2, formats=()) as cap:
    try:
        from flash_attn import flash_attn_func   # not installed: the fallback path runs
        HAVE = True
    except ImportError:
        HAVE = False
    for i in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        cap.step()
print("have", HAVE)
'''


def test_a_guarded_import_of_a_missing_gpu_library_is_reported_where_nothing_stands_in(tmp_path):
    """No stand-in where opscope does not stand in for the GPU (here the in-process API, as on a real device): the
    import fails as it would, and the line is reported: the script ran its fallback path."""
    import importlib.util

    import pytest
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    script = tmp_path / "guarded.py"
    out = tmp_path / "run"
    script.write_text(f"OUT = {str(out)!r}\n" + GUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "have False" in proc.stdout
    (finding,) = [f for f in load_scan(out)["findings"] if f["rule"] == "library-fallback"]
    assert finding["api"].startswith("import flash_attn") and finding["line"] == 10 and finding["severity"] == "info"
