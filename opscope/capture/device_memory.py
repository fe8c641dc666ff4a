"""Device memory of a real (not ``--mode fake``) scan: each step's peak and what it was made of.

The memory fit needs, per step, the peak of live device memory and its parts: parameters,
gradients, optimizer state, activations.  A real scan measures them from two sources:

* the allocator: the profiler's memory events (``profile_memory``) on the CPU, where the
  scan stands in for the GPU; ``torch.cuda.max_memory_allocated`` on a real GPU.  The CPU
  events report every allocation made while a step was recorded and every free of a block
  allocated while one was (a block allocated while nothing recorded memory is freed
  silently), so the step's live memory is what was live at its first forward plus the
  running sum of its events from there;
* Python, at step boundaries: the parameters of the top-level modules that ran, their
  gradients and the optimizers' state, each storage counted once.  Gradients made during
  the step are marked as they are accumulated (a zero-length ``opscope.memory#grad=BYTES``
  range from a post-accumulate-grad hook), so the peak's breakdown knows how many were live.

The step's allocations are summed from its first forward (``opscope.memory#forward``): what
the script allocates before it (its set-up in the first step, the step's batch) is host
data, as ``--mode fake`` counts it too.

Tensors made before the first forward and kept through the step without a free (an EMA copy
of the model, DDP's gradient buckets) are not seen on the CPU; fake mode counts them.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

MEMORY_MARK = "opscope.memory#"             # a zero-length range: "#forward" (the step's first forward), "#grad=BYTES"
MEMORY_EVENT = "[memory]"            # the profiler's allocation event (nbytes > 0 alloc, < 0 free)
PARTS = ("parameters", "gradients", "optimizer_state")
# the profiler ranges of the update, whose new allocations are (mostly) optimizer state
OPTIMIZER_RANGES = ("Optimizer.step#", "opscope.optimizer")
PHASE_RANGES = (("autograd::engine::evaluate_function", "backward"), ("opscope.backward", "backward"),
                ("Optimizer.step#", "optimizer"), ("Optimizer.zero_grad#", "optimizer"),
                ("opscope.optimizer", "optimizer"), ("opscope.forward", "forward"), ("opscope.eval", "eval"))


def _storage_key(tensor) -> tuple[int, int] | None:
    """(storage id, bytes) of a plain strided tensor on a real device (not meta, not fake)."""
    try:
        if tensor.device.type == "meta":
            return None
        storage = tensor.untyped_storage()
        return storage._cdata, int(storage.nbytes())
    except Exception:  # a tensor subclass without storage (DTensor, a fake tensor)
        return None


class DeviceMemory:
    """What a capture session knows of the job's device memory (see the module docstring)."""

    def __init__(self, mark, cuda: bool = False):
        self._mark = mark                     # mark(name): a zero-length profiler range
        self.cuda = cuda                      # a real GPU: its allocator's statistics, no memory events
        self.modules: weakref.WeakSet = weakref.WeakSet()
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self._hooked: weakref.WeakSet = weakref.WeakSet()
        self._handles: list = []
        self._grads: set[int] = set()         # gradient storages known live this step
        self.start: dict[str, int] = dict.fromkeys(PARTS, 0)
        self.grads_at_forward: int | None = None

    @property
    def profile_memory(self) -> bool:
        """Whether the step's profiler should report allocations (the CPU: no allocator statistics)."""
        return not self.cuda

    # -- what the session tells it -------------------------------------------------------
    def see_module(self, module) -> None:
        """A top-level module ran forward: its parameters are the job's; hook their gradients."""
        if module in self.modules:
            return
        self.modules.add(module)
        hook = getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)
        if hook is None:   # torch < 2.1: gradients counted at step boundaries only
            return
        for param in module.parameters():
            if param in self._hooked or not param.requires_grad:
                continue
            try:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))
                self._hooked.add(param)
            except RuntimeError:   # not a leaf (a parameter of a parametrization)
                pass

    def see_optimizer(self, optimizer) -> None:
        self.optimizers.add(optimizer)

    def forward_started(self) -> None:
        """The step's first forward: the gradients still live then (the previous step's, unless zeroed)."""
        if self.grads_at_forward is None:
            keys = self._grad_keys()
            self._grads = set(keys)
            self.grads_at_forward = sum(keys.values())
            self._mark(f"{MEMORY_MARK}forward")

    def _grad_ready(self, param) -> None:
        key = _storage_key(param.grad) if param.grad is not None else None
        if key is not None and key[0] not in self._grads:
            self._grads.add(key[0])
            self._mark(f"{MEMORY_MARK}grad={key[1]}")

    # -- step boundaries --------------------------------------------------------------------
    def step_started(self) -> None:
        self.start = self.parts()
        self.grads_at_forward = None
        self._grads = set(self._grad_keys())
        if self.cuda:
            try:
                torch.cuda.reset_peak_memory_stats()
            except Exception:
                pass

    def step_ended(self) -> dict[str, Any]:
        """What the step writer needs to turn the step's memory events into its peak."""
        state: dict[str, Any] = {"start": self.start, "end": self.parts(), "grads_at_forward": self.grads_at_forward}
        if self.cuda:
            try:
                state["cuda_peak"] = int(torch.cuda.max_memory_allocated())
            except Exception:
                pass
        return state

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- counting --------------------------------------------------------------------------------
    def _params(self):
        seen: set[int] = set()
        for module in list(self.modules):
            for param in module.parameters():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield param

    def _grad_keys(self) -> dict[int, int]:
        keys: dict[int, int] = {}
        for param in self._params():
            if param.grad is not None and (key := _storage_key(param.grad)) is not None:
                keys[key[0]] = key[1]
        return keys

    def parts(self) -> dict[str, int]:
        """Bytes of parameters (and the modules' buffers, as fake mode counts them), gradients and optimizer
        state now, each storage once."""
        params: dict[int, int] = {}
        buffers = (b for module in list(self.modules) for b in module.buffers())   # BatchNorm's running stats
        for tensor in (*self._params(), *buffers):
            if (key := _storage_key(tensor)) is not None:
                params[key[0]] = key[1]
        state: dict[int, int] = {}
        for optimizer in list(self.optimizers):
            for per_param in list(getattr(optimizer, "state", {}).values()):
                for value in (per_param.values() if isinstance(per_param, dict) else ()):
                    if isinstance(value, torch.Tensor) and (key := _storage_key(value)) is not None \
                            and key[0] not in params:
                        state[key[0]] = key[1]
        return {"parameters": sum(params.values()), "gradients": sum(self._grad_keys().values()),
                "optimizer_state": sum(state.values())}


def step_peak(step: int, state: dict, memory: list, marks: list, ranges: list) -> dict | None:
    """One step's memory record (the shape ``memory_fit`` reads, as fake mode's ``MemoryTracker`` writes).

    ``memory``: (ns, bytes) allocator events; ``marks``: (ns, mark text after '#') of the step;
    ``ranges``: (start ns, end ns, name) of the phase and optimizer ranges.  None when the step
    reports nothing (no events on a device without statistics) or ran no module forward.

    Live memory at a moment of the step = parameters + optimizer state + gradients live at the first
    forward + older tensors Python did not count (a previous iteration's outputs) + the running sum of
    the step's events from that forward.  The older tensors are known only by their frees: at least what
    the step frees beyond its allocations (gradient frees inside ``Optimizer.zero_grad`` excepted, which
    are counted gradients) was live before.
    """
    start, end = state.get("start") or {}, state.get("end") or {}
    params = int(end.get("parameters") or start.get("parameters") or 0)
    old_state = int(start.get("optimizer_state") or 0)
    end_state = int(end.get("optimizer_state") or 0)
    gfwd = state.get("grads_at_forward")
    old_grads = int(start.get("gradients") or 0) if gfwd is None else int(gfwd)
    base = params + old_state + old_grads
    zeroing = [(s, e) for s, e, name in ranges if name.startswith("Optimizer.zero_grad#")]
    if state.get("cuda_peak") is not None:   # a real GPU: the allocator's own peak, its time unknown
        peak, at, freed_grads, state_at_peak = max(int(state["cuda_peak"]), base), None, 0, max(old_state, end_state)
    else:
        # no module ran forward in the step (hand-written tensor code): what its tensors are is unknown
        begin = min((ns for ns, text in marks if text == "forward"), default=None)
        if not memory or begin is None:
            return None
        events = [(ns, n, any(s <= ns <= e for s, e in zeroing) and n < 0) for ns, n in sorted(memory) if ns >= begin]
        running, uncounted, low, timeline = 0, 0, 0, []
        for ns, nbytes, grad_free in events:
            running += nbytes
            uncounted += nbytes if not grad_free else 0
            low = min(low, uncounted)
            timeline.append((ns, running))
        older = -low                          # older tensors freed in the step: live until then
        peak, at, at_value = base + older, None, 0
        for ns, value in timeline:
            if base + older + value > peak:
                peak, at, at_value = base + older + value, ns, value
        freed_grads = -sum(n for ns, n, grad_free in events if grad_free and (at is None or ns <= at))
        opt_start = max((s for s, e, name in ranges if name.startswith(OPTIMIZER_RANGES) and at is not None
                         and s <= at <= e), default=None)
        if opt_start is None:
            state_at_peak = old_state
        else:   # a peak inside the update: what the update allocated is its state and temporaries (fake mode's classes)
            before = next((v for ns, v in reversed(timeline) if ns < opt_start), 0)
            state_at_peak = old_state + max(0, at_value - before)
    new_grads = sum(int(text[5:]) for ns, text in marks if text.startswith("grad=") and (at is None or ns <= at))
    grads = max(0, old_grads - freed_grads) + new_grads
    breakdown = {"parameters": params, "gradients": grads, "optimizer_state": state_at_peak}
    return {"bytes": int(peak), "breakdown": breakdown, "phase": _phase_at(at, ranges) if at is not None else None,
            "where": None, "module": None, "autograd_node": None, "step": step,
            "end_bytes": sum(int(end.get(p) or 0) for p in PARTS), "end_breakdown": {p: int(end.get(p) or 0) for p in PARTS}}


def _phase_at(ns: int, ranges: list) -> str:
    """The phase of the innermost phase range open at ``ns`` ("forward" between them, as a step mostly is)."""
    best: tuple[int, str] | None = None
    for s, e, name in ranges:
        if s <= ns <= e:
            phase = next((p for prefix, p in PHASE_RANGES if name.startswith(prefix)), None)
            if phase is not None and (best is None or s >= best[0]):
                best = (s, phase)
    return best[1] if best else "forward"


def is_phase_range(name: str) -> bool:
    return name.startswith(tuple(prefix for prefix, _ in PHASE_RANGES))


def quiet_allocator_notice(profile) -> None:
    """Spend the CPU allocator's once-a-process notice out of sight.

    Under ``profile_memory`` the CPU allocator logs "Memory block of unknown size was allocated
    before the profiling started..." the first time a block older than the profiler is freed,
    which every step of a scan does (it is how the step's events are read here, not a problem of
    the script).  Freeing one such block under a throw-away profiler, with the process's stderr
    pointed at /dev/null, uses that one notice up.
    """
    import os
    import sys
    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        block = torch.empty(16)
        os.dup2(null, 2)
        with profile(profile_memory=True, use_kineto=True):
            del block
    except Exception:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
