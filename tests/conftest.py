"""Shared fixtures: run the real `opscope` CLI in a subprocess, like a user would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "data" / "scripts"
SHARED = ROOT.parent / "shared"


def run_opscope(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """Run `python -m opscope ARGS` and return the completed process (text output)."""
    return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout)


def load_scan(out: Path) -> dict:
    return json.loads((Path(out) / "scan.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def cnn_scan(tmp_path_factory) -> Path:
    """examples/train_cnn.py scanned for 3 steps on the CPU (shared by many tests)."""
    out = tmp_path_factory.mktemp("cnn_scan")
    proc = run_opscope("scan", EXAMPLES / "train_cnn.py", "--steps", "3", "--out", out, "--quiet",
                       "--", "--epochs", "1", "--samples", "256")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def dynamic_scan(tmp_path_factory) -> Path:
    """examples/train_dynamic.py: partial batch, variable length, masks, nonzero, masked_select."""
    out = tmp_path_factory.mktemp("dynamic_scan")
    proc = run_opscope("scan", EXAMPLES / "train_dynamic.py", "--steps", "6", "--out", out, "--quiet",
                       "--format", "", "--", "--samples", "70", "--batch-size", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="session")
def huber_scan(tmp_path_factory) -> Path:
    """examples/train_huber.py scanned against torch_npu 2.14.0."""
    out = tmp_path_factory.mktemp("huber_scan")
    proc = run_opscope("scan", EXAMPLES / "train_huber.py", "--steps", "3", "--out", out, "--quiet",
                       "--format", "", "--target", "2.14.0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False
