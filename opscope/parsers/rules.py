"""The diff rules (support_matrix/diff_rules.yaml) as fast predicates.

Kept as data so that a new backend's private kernels or a new NPU-inserted cast is a
one-line yaml change, not a code change.
"""
from __future__ import annotations

import fnmatch
import re
from functools import lru_cache

RULES_FILE = "diff_rules.yaml"


def _matcher(patterns):
    """One compiled regex for a list of fnmatch patterns (None when the list is empty)."""
    if not patterns:
        return None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _standalone(name: str) -> bool:
    """A backend kernel that runs with no public operator around it (``standalone`` in
    backend_private_ops.yaml ``implements``: cuDNN's batch-norm backward): an operator, as the scan records it."""
    from opscope.knowledge import backend_kernel
    return bool((backend_kernel(name) or {}).get("standalone"))


@lru_cache(maxsize=1)
def rules() -> CompiledRules:
    from opscope.knowledge import load

    return CompiledRules(load(RULES_FILE))


class CompiledRules:
    """Compiled predicates over operator/kernel names."""

    def __init__(self, raw: dict):
        self.raw = raw
        self._structural = _matcher(raw.get("structural"))
        # ATen backend-private kernels come from the one shared list; the yaml adds
        # what only traces show (aclnn* and other non-ATen implementation names)
        from opscope.knowledge import backend_private_patterns
        self._private = _matcher([f"aten::{p}" for p in backend_private_patterns()]
                                 + list(raw.get("private_ops") or []))
        self._inserted_ops = _matcher(raw.get("npu_inserted_ops"))
        self._kernel_families = [re.compile(p) for p in raw.get("npu_kernel_name_families") or []]
        self._inserted_kernel_types = set(raw.get("npu_inserted_kernel_types") or [])
        self._user_cast_parents = _matcher(raw.get("user_cast_parents"))
        self._never_fold = _matcher(raw.get("never_fold"))
        self.python_scalar_dtypes = set(raw.get("python_scalar_dtypes") or [])
        self.known_differences = [(_matcher(d.get("ops") or []), d.get("side"), d.get("dtype") or {}, d["cause"])
                                  for d in raw.get("known_differences") or []]
        self._fallback_children = _matcher(raw.get("fallback_children"))
        self._step = _matcher(raw.get("step_annotations"))
        self.phase_rules = [(_matcher([r["pattern"]]), r["phase"]) for r in raw.get("phase_annotations") or []]
        self.fallback_log = [re.compile(p) for p in raw.get("fallback_log_patterns") or []]
        self.device_processes = set(raw.get("device_processes") or [])
        self.device_kernel_categories = set(raw.get("device_kernel_categories") or [])
        self.launch_flow_categories = set(raw.get("launch_flow_categories") or [])
        self._kind_cache: dict[str, str] = {}
        tasks = raw.get("device_task_classes") or {}
        self.communication_processes = set(tasks.get("communication_processes") or [])
        self._comm_threads = _matcher(tasks.get("communication_threads"))
        self._comm_subtask_threads = _matcher(tasks.get("communication_subtask_threads"))
        self._comm_kernels = _matcher(tasks.get("communication_kernels"))
        self._comm_tasks = _matcher(tasks.get("communication_task_types"))
        self._transfer_tasks = _matcher(tasks.get("transfer_task_types"))
        self.transfer_categories = set(tasks.get("transfer_categories") or [])
        self._sync_tasks = _matcher(tasks.get("sync_task_types"))
        self._transfer_ops = _matcher(tasks.get("transfer_ops"))
        self._host_transfer_tasks = _matcher(tasks.get("host_transfer_task_types"))
        self._host_transfer_kernels = _matcher(tasks.get("host_transfer_kernels"))
        self.maybe_host_transfer_task_types = set(tasks.get("maybe_host_transfer_task_types") or [])
        self.to_copy_ops = set(tasks.get("to_copy_ops") or [])

    def kind(self, name: str) -> str:
        """'op' (compared), 'private' (folded into its parent op) or 'annotation'."""
        kind = self._kind_cache.get(name)
        if kind is None:
            if "::" not in name or (self._structural and self._structural.match(name)):
                kind = "annotation"
            elif self._private and self._private.match(name) and not _standalone(name):
                kind = "private"
            else:
                kind = "op"
            self._kind_cache[name] = kind
        return kind

    def phase_of_annotation(self, name: str) -> str | None:
        for matcher, phase in self.phase_rules:
            if matcher.match(name):
                return phase
        return None

    def step_of_annotation(self, name: str) -> int | None:
        if self._step and self._step.match(name):
            tail = name.rsplit("#", 1)[-1]
            return int(tail) if tail.isdigit() else None
        return None

    def is_inserted_op(self, name: str) -> bool:
        return bool(self._inserted_ops and self._inserted_ops.match(name))

    def kernel_type(self, name: str) -> str:
        """'aclnnTopk_CastAiCore_Cast' -> 'Cast'; 'trans_TransData_12' -> 'TransData'; 'Conv2D4' -> 'Conv2D'."""
        for family in self._kernel_families:
            match = family.match(name)
            if match:
                return match.group("type")
        return name

    def is_inserted_kernel(self, name: str) -> bool:
        return self.kernel_type(name) in self._inserted_kernel_types

    def is_fallback_child(self, name: str) -> bool:
        return bool(self._fallback_children and self._fallback_children.match(name))

    def communication_thread(self, thread_name: str | None) -> str | None:
        """'collective' (one event per collective), 'subtask' (its details) or None."""
        if not thread_name:
            return None
        if self._comm_threads and self._comm_threads.match(thread_name):
            return "collective"
        if self._comm_subtask_threads and self._comm_subtask_threads.match(thread_name):
            return "subtask"
        return None

    def task_class(self, name: str, task_type: str | None, category: str | None) -> str:
        """What a device task is: 'communication' | 'comm-subtask' | 'transfer' | 'sync' | 'compute'."""
        if self._comm_kernels and self._comm_kernels.match(name):
            return "communication"
        if task_type:
            if self._comm_tasks and self._comm_tasks.match(task_type):
                return "comm-subtask"
            if self._transfer_tasks and self._transfer_tasks.match(task_type):
                return "transfer"
            if self._sync_tasks and self._sync_tasks.match(task_type):
                return "sync"
        if category in self.transfer_categories:
            return "transfer"
        return "compute"

    def is_transfer_op(self, name: str) -> bool:
        return bool(self._transfer_ops and self._transfer_ops.match(name))

    def is_host_transfer(self, name: str, task_type: str | None):
        """A copy between host and device memory: True, False (device to device) or None
        (the task type does not say: a ``.to()`` above it decides)."""
        if task_type and self._host_transfer_tasks and self._host_transfer_tasks.match(task_type):
            return True
        if self._host_transfer_kernels and self._host_transfer_kernels.match(name):
            return True
        if task_type and task_type in self.maybe_host_transfer_task_types:
            return None
        return False

    def is_user_cast_parent(self, name: str | None) -> bool:
        return bool(name and self._user_cast_parents and self._user_cast_parents.match(name))

    def never_fold(self, name: str) -> bool:
        return bool(self._never_fold and self._never_fold.match(name))

    def is_python_scalar_dtype(self, dtype) -> bool:
        return dtype in self.python_scalar_dtypes

    def known_cause(self, name: str, side: str, dtype_a=None, dtype_b=None) -> str | None:
        """The likely cause of a difference (``side``: 'a' / 'b' only there, 'dtype' a dtype change)."""
        for matcher, want_side, dtype, cause in self.known_differences:
            if not (matcher and matcher.match(name)):
                continue
            if side == "dtype":
                if dtype and dtype.get("a") == dtype_a and dtype.get("b") == dtype_b:
                    return cause
            elif not dtype and (want_side in (None, side)):
                return cause
        return None
