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
