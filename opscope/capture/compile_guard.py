"""Make ``torch.compile`` a no-op during a scan, so the scan measures the eager program.

Why: Dynamo would trace opscope's own ``TorchFunctionMode`` (hitting its recompile
limit), and compiled graphs replace the ATen calls of the user's lines with fused
kernels and compile machinery (``prims::view_of``, ``aten::detach`` without a source).
The operators a compiled model runs on the NPU are the eager ATen operators this scan
judges; what torch_npu offers instead of inductor is reported as a finding at the line.
"""
from __future__ import annotations

import torch


class CompileGuard:
    def __init__(self, findings):
        self.findings = findings
        self._undo: list = []

    def install(self) -> None:
        findings = self.findings
        orig_compile = torch.compile

        def compile_(model=None, *args, **kwargs):
            findings.record("torch-compile", "torch.compile()", depth=2)
            if model is None:  # used as @torch.compile(...) with options
                return lambda fn: fn
            return model

        self._patch(torch, "compile", compile_, orig_compile)
        module_compile = getattr(torch.nn.Module, "compile", None)
        if module_compile is not None:
            def module_compile_(this, *args, **kwargs):
                findings.record("torch-compile", "Module.compile()", depth=2)

            self._patch(torch.nn.Module, "compile", module_compile_, module_compile)

    def _patch(self, owner, attr, value, original) -> None:
        self._undo.append((owner, attr, original))
        setattr(owner, attr, value)

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()
