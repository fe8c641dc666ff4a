"""Steps written by the background writer thread are the steps the in-line path writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import load_scan

SCRIPT = '''
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(70, 12), torch.randint(0, 3, (70,)))
loader = DataLoader(data, batch_size=16)          # 70 = 4 x 16 + 6: the last batch is partial
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def _scan(tmp_path: Path, name: str, writer: str, *extra: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train_small.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OPSCOPE_STEP_WRITER=writer)
    return subprocess.run([sys.executable, "-m", "opscope", "scan", str(script), "--steps", "7", "--format", "",
                           "--quiet", "--out", str(tmp_path / name), *extra],
                          capture_output=True, text=True, timeout=300, env=env)


def _signatures(out: Path) -> list:
    """Every operator of the scan with what the analysis reads, timings left out."""
    scan = load_scan(out)
    keep = ("name", "input_shapes", "dtypes", "phase", "source", "calls", "steps", "dynamic", "verdict", "parent")
    return sorted(json.dumps({k: op.get(k) for k in keep}, sort_keys=True) for op in scan["operators"])


def _steps_log(out: Path) -> list:
    rows = [json.loads(line) for line in (out / "capture" / "steps.jsonl").read_text().splitlines()]
    return [(r["step"], r["complete"], sorted(json.dumps(c[:4]) for c in r["calls"])) for r in rows]


def test_thread_writer_writes_what_the_inline_path_writes(tmp_path):
    threaded, inline = _scan(tmp_path, "thread", "thread"), _scan(tmp_path, "inline", "inline")
    assert threaded.returncode == inline.returncode == 0, threaded.stderr[-1500:] + inline.stderr[-1500:]
    assert _steps_log(tmp_path / "thread") == _steps_log(tmp_path / "inline")
    assert len(_steps_log(tmp_path / "thread")) == 7
    assert _signatures(tmp_path / "thread") == _signatures(tmp_path / "inline")
    assert len(list((tmp_path / "thread" / "traces").glob("step_*.json"))) == 7


def test_a_write_failure_on_the_writer_thread_keeps_the_steps_before_it(tmp_path):
    """The disk fills while the writer thread writes step 3: steps 1-2 are kept, capture stops
    (exit 7), and no later step slips into the log."""
    env = dict(os.environ, OPSCOPE_FAIL_WRITE="traces/step_0003.json")
    script = tmp_path / "train_small.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "opscope", "scan", str(script), "--steps", "7", "--format", "",
                           "--quiet", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, env=dict(env, OPSCOPE_STEP_WRITER="thread"))
    assert proc.returncode == 7, proc.stderr[-1500:]
    assert "Traceback" not in proc.stderr
    assert [row[0] for row in _steps_log(tmp_path / "run")] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "run" / "traces").glob("step_*.json")) == \
        ["step_0001.json", "step_0002.json"]
