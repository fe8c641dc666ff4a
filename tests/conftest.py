"""Shared fixtures: run the real `opscope` CLI in a subprocess, like a user would.

The suite tests the CUDA stand-in: on a machine with a GPU, every test runs with the GPU hidden
(``CUDA_VISIBLE_DEVICES=""`` in this process before torch touches CUDA, so in-process captures and every
subprocess scan a test starts see no GPU and take the stand-in, as on a machine without one). Only tests
marked ``gpu`` see the device: they are skipped without one, and give ``gpu_env()`` (or
``run_opscope(..., gpu=True)``) to the processes they start. ``has_cuda()`` says whether the machine has a
GPU, asked once, in a child process, with the environment the suite was started with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "data" / "scripts"
SHARED = ROOT.parent / "shared"

# what the suite's first process found, handed to pytest-xdist workers (started from it) through the environment
_HAS_GPU_KEY = "OPSCOPE_TEST_HAS_GPU"                 # "1" or "0"
_GIVEN_DEVICES_KEY = "OPSCOPE_TEST_CUDA_VISIBLE_DEVICES"   # CUDA_VISIBLE_DEVICES as given ("<unset>": not set)
_UNSET = "<unset>"


def _probe_gpu() -> bool:
    """Whether torch sees a CUDA device with the environment as given, asked in a child process so that this
    one never initialises CUDA (CUDA reads CUDA_VISIBLE_DEVICES once, when it starts)."""
    try:
        import torch
    except Exception:
        return False
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:   # a CPU build
        return False
    env = dict(os.environ)
    given = os.environ.get(_GIVEN_DEVICES_KEY)
    if given is not None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if given != _UNSET:
            env["CUDA_VISIBLE_DEVICES"] = given
    try:
        proc = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                              capture_output=True, text=True, timeout=180, env=env)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and proc.stdout.strip().endswith("1")


def _hide_gpu() -> bool:
    """Ask once whether there is a GPU, then hide it from this process and every process it starts."""
    if _HAS_GPU_KEY not in os.environ:
        os.environ[_GIVEN_DEVICES_KEY] = os.environ.get("CUDA_VISIBLE_DEVICES", _UNSET)
        os.environ[_HAS_GPU_KEY] = "1" if _probe_gpu() else "0"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return os.environ[_HAS_GPU_KEY] == "1"


_HAS_GPU = _hide_gpu()


def has_cuda() -> bool:
    """Whether this machine has a CUDA GPU (hidden from every test but those marked ``gpu``)."""
    return _HAS_GPU


def gpu_env(**extra: str) -> dict:
    """The environment for a process of a ``gpu`` test: the suite's own with the GPU visible again."""
    env = dict(os.environ, **extra)
    given = env.get(_GIVEN_DEVICES_KEY, _UNSET)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if given != _UNSET:
        env["CUDA_VISIBLE_DEVICES"] = given
    return env


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped on a machine without a CUDA GPU."""
    if _HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def run_opscope(*args, cwd=None, timeout=300, gpu=False) -> subprocess.CompletedProcess:
    """Run `python -m opscope ARGS` and return the completed process (text output).

    The GPU stays hidden (the stand-in) unless ``gpu``: for tests marked ``gpu``."""
    return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=gpu_env() if gpu else None)


def bench_module(name: str):
    """A script of bench/ imported as a module (``bench_module("gpu_check")``), once per process."""
    import importlib.util
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # before it runs: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


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
