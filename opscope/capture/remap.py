"""Run a GPU training script on a machine without a GPU, and record every CUDA API it used.

Only active when the scan runs on the CPU while the script asks for CUDA.  Each remap
that fires becomes a ``Finding`` (origin ``runtime``) at the user's file:line, with the
same rule ids as the static scan (``support_matrix/cuda_api_rules.yaml``) so the two
de-duplicate.  On a real GPU or NPU nothing here is installed.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import time

import torch

from opscope.model import Finding

def _rules() -> dict:
    """rule id -> message, replacement, became, severity (``support_matrix/runtime_remaps.yaml``)."""
    from opscope.knowledge import load
    return load("runtime_remaps.yaml")["rules"]


class RuntimeFindings:
    """Collects remap findings keyed by (rule, file, line)."""

    def __init__(self, user_code):
        self.user_code = user_code
        self.items: dict[tuple, Finding] = {}

    def record(self, rule: str, api: str, depth: int = 2, remapped: bool = True) -> None:
        where = self.user_code.frame_of(sys._getframe(depth))
        file, line = where if where else (None, None)
        key = (rule, file, line)
        found = self.items.get(key)
        if found:
            found.count += 1
            return
        spec = _rules()[rule]
        self.items[key] = Finding(rule=rule, file=file, line=line, api=api, message=spec["message"],
                                  replacement=spec.get("replacement"), severity=spec.get("severity", "warning"),
                                  origin="runtime", remapped_to=spec.get("became") if remapped else None,
                                  library=self.user_code.library_of(sys._getframe(depth)))

    def list(self) -> list[Finding]:
        return list(self.items.values())


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.split(":")[0] == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)   # .to(rank), device=local_rank: cuda:N


class _FakeEvent:
    """CPU stand-in for torch.cuda.Event: records wall time so elapsed_time works."""

    def __init__(self, *args, **kwargs):
        self.t = None

    def record(self, *args, **kwargs):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def wait(self, *args, **kwargs):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return ((end.t or 0) - (self.t or 0)) * 1000.0


class _FakeStream:
    def __init__(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, event=None):
        event = event or _FakeEvent()
        event.record()
        return event

    def query(self):
        return True


class _FakeProps:
    name = "opscope CPU remap"
    total_memory = 0
    major, minor = 0, 0
    multi_processor_count = 0


class CudaRemapper:
    """Installs CUDA->CPU patches; ``on_call`` rewrites device args of torch calls."""

    def __init__(self, findings: RuntimeFindings):
        self.findings = findings
        self.user_code = findings.user_code
        self._undo: list = []
        self.moved = False
        self.device_count = 1   # what device_count() answers (the world size for distributed runs)

    # -- called by SourceTracker for every torch call --------------------------------
    def on_call(self, func, args, kwargs):
        """Rewrite CUDA device arguments; ``self.moved`` says whether this call targeted CUDA."""
        name = getattr(func, "__name__", "")
        self.moved = False
        if name == "cuda":
            self.moved = True
            self.findings.record("cuda-call", "Tensor.cuda()", depth=3)
            return args, kwargs, True, args[0]
        dev = kwargs.get("device")
        if dev is not None and _is_cuda(dev):
            self.moved = True
            kwargs = dict(kwargs, device="cpu")
            self.findings.record("cuda-device", f"{name}(device='cuda')", depth=3)
        if name == "to" and len(args) > 1 and _is_cuda(args[1]):
            self.moved = True
            args = (args[0], "cpu") + tuple(args[2:])
            self.findings.record("cuda-device", ".to('cuda')", depth=3)
        if name == "pin_memory":
            self.findings.record("pin-memory", "Tensor.pin_memory()", depth=3)
            return args, kwargs, True, args[0]
        return args, kwargs, False, None

    # -- module-level patches ---------------------------------------------------------
    def _patch(self, owner, attr, value):
        old = getattr(owner, attr, None)
        self._undo.append((owner, attr, old))
        setattr(owner, attr, value)

    def _from_user(self, depth=2) -> bool:
        frame = sys._getframe(depth)
        return self.user_code.display(frame.f_code.co_filename) is not None

    def install(self) -> None:
        cuda = torch.cuda
        rec = self.findings.record

        def simple(rule, api, result=None, name=None):
            """Fake for user calls; library code (e.g. torch.manual_seed) keeps the original."""
            original = getattr(cuda, name) if name else None

            def fn(*args, **kwargs):
                if original is not None and not self._from_user():
                    return original(*args, **kwargs)
                rec(rule, api, depth=2)
                return result() if callable(result) else result
            return fn

        orig_available = cuda.is_available

        def is_available():
            if self._from_user():
                rec("cuda-is-available", "torch.cuda.is_available()")
                return True
            return orig_available()

        orig_count = cuda.device_count

        def device_count():
            if self._from_user():
                rec("cuda-device-count", "torch.cuda.device_count()")
                return self.device_count
            return orig_count()

        self._patch(cuda, "is_available", is_available)
        self._patch(cuda, "device_count", device_count)
        self._patch(cuda, "synchronize", simple("cuda-synchronize", "torch.cuda.synchronize()", name="synchronize"))
        self._patch(cuda, "set_device", simple("cuda-set-device", "torch.cuda.set_device()", name="set_device"))
        self._patch(cuda, "current_device", simple("cuda-current-device", "torch.cuda.current_device()", 0, name="current_device"))
        self._patch(cuda, "get_device_name", simple("cuda-current-device", "torch.cuda.get_device_name()", _FakeProps.name, name="get_device_name"))
        self._patch(cuda, "get_device_properties", simple("cuda-current-device", "torch.cuda.get_device_properties()", _FakeProps, name="get_device_properties"))
        self._patch(cuda, "get_device_capability", simple("cuda-current-device", "torch.cuda.get_device_capability()", (0, 0), name="get_device_capability"))
        for fn in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
            self._patch(cuda, fn, simple("cuda-manual-seed", f"torch.cuda.{fn}()", name=fn))
        for fn in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                   "memory_cached", "max_memory_cached"):
            self._patch(cuda, fn, simple("cuda-memory", f"torch.cuda.{fn}()", 0, name=fn))
        for fn in ("empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats"):
            self._patch(cuda, fn, simple("cuda-memory", f"torch.cuda.{fn}()", name=fn))
        self._patch(cuda, "memory_summary", simple("cuda-memory", "torch.cuda.memory_summary()", "", name="memory_summary"))
        self._patch(cuda, "memory_stats", simple("cuda-memory", "torch.cuda.memory_stats()", dict, name="memory_stats"))

        # classes, not functions: libraries use them in annotations (`torch.cuda.Stream | None`)
        class event(_FakeEvent):
            def __init__(self, *args, **kwargs):
                rec("cuda-event", "torch.cuda.Event()")
                super().__init__()

        class stream(_FakeStream):
            def __init__(self, *args, **kwargs):
                rec("cuda-stream", "torch.cuda.Stream()")
                super().__init__()

        def stream_ctx(*args, **kwargs):
            rec("cuda-stream", "torch.cuda.stream()")
            return contextlib.nullcontext()

        self._patch(cuda, "Event", event)
        self._patch(cuda, "Stream", stream)
        self._patch(cuda, "current_stream", simple("cuda-stream", "torch.cuda.current_stream()", _FakeStream, name="current_stream"))
        self._patch(cuda, "default_stream", simple("cuda-stream", "torch.cuda.default_stream()", _FakeStream, name="default_stream"))
        self._patch(cuda, "stream", stream_ctx)
        self._patch(cuda, "device", lambda *a, **k: (rec("cuda-set-device", "torch.cuda.device()"), contextlib.nullcontext())[1])
        self._install_accelerator(rec)
        self._install_module(rec)
        self._install_amp(rec)
        self._install_cudnn(rec)
        self._install_dataloader(rec)
        self._install_distributed(rec)
        self._install_load(rec)

    def _install_accelerator(self, rec):
        """``torch.accelerator`` (torch >= 2.6): report a CUDA accelerator, remapped like torch.cuda."""
        acc = getattr(torch, "accelerator", None)
        if acc is None:
            return
        remapper = self

        def fake(api, result=None):
            original = getattr(acc, api, None)

            def fn(*args, **kwargs):
                if original is not None and not remapper._from_user():
                    return original(*args, **kwargs)
                rec("accelerator-api", f"torch.accelerator.{api}()")
                return result() if callable(result) else result
            return fn

        table = {"is_available": lambda: True, "current_accelerator": lambda: torch.device("cuda"),
                 "device_count": lambda: self.device_count, "current_device_index": 0,
                 "current_device_idx": 0, "set_device_index": None, "set_device_idx": None,
                 "synchronize": None, "empty_cache": None, "memory_allocated": 0,
                 "max_memory_allocated": 0, "memory_reserved": 0, "max_memory_reserved": 0,
                 "reset_peak_memory_stats": None, "memory_stats": dict,
                 "device_index": lambda: contextlib.nullcontext()}
        for api, result in table.items():
            if hasattr(acc, api):
                self._patch(acc, api, fake(api, result))

    def _install_module(self, rec):
        """Module.cuda()/.to('cuda') on modules without tensors never reach a torch call."""
        module_cls = torch.nn.Module
        orig_to = module_cls.to
        remapper = self

        def mark(module):
            for t in list(module.parameters()) + list(module.buffers()):
                t._opscope_dev = True  # "on the accelerator" in the original script

        def cuda_(this, device=None):
            if remapper._from_user():
                rec("cuda-call", "Module.cuda()")
            mark(this)
            return this

        def to_(this, *args, **kwargs):
            if any(_is_cuda(a) for a in args) or _is_cuda(kwargs.get("device")):
                if remapper._from_user():
                    rec("cuda-device", "Module.to('cuda')")
                args = tuple(f"cuda:{a}" if _is_cuda(a) and isinstance(a, int) else a for a in args)
                if isinstance(kwargs.get("device"), int):
                    kwargs = dict(kwargs, device=f"cuda:{kwargs['device']}")
                out = orig_to(this, *args, **kwargs)
                mark(this)
                return out
            return orig_to(this, *args, **kwargs)

        self._patch(module_cls, "cuda", cuda_)
        self._patch(module_cls, "to", to_)

    def _install_amp(self, rec):
        from torch.amp import autocast_mode, grad_scaler

        orig_init = autocast_mode.autocast.__init__

        @functools.wraps(orig_init)
        def autocast_init(this, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                rec("cuda-amp-autocast", "torch.cuda.amp.autocast / torch.autocast('cuda')", depth=2)
                device_type = "cpu"
                dtype = dtype or torch.float16
            return orig_init(this, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self._patch(autocast_mode.autocast, "__init__", autocast_init)
        orig_scaler = grad_scaler.GradScaler.__init__

        @functools.wraps(orig_scaler)
        def scaler_init(this, device="cuda", *args, **kwargs):
            if device == "cuda":
                rec("cuda-amp-gradscaler", "torch.cuda.amp.GradScaler", depth=2)
                device = "cpu"
            return orig_scaler(this, device, *args, **kwargs)

        self._patch(grad_scaler.GradScaler, "__init__", scaler_init)
        # torch.cuda.amp.* are thin subclasses that pass "cuda" to the patched __init__s.

    def _install_cudnn(self, rec):
        cudnn_mod = torch.backends.cudnn
        cls = type(cudnn_mod)
        orig_setattr = cls.__setattr__
        remapper = self

        def setattr_(this, name, value):
            if name in ("benchmark", "deterministic", "enabled", "allow_tf32") and remapper._from_user():
                rec("cudnn-flags", f"torch.backends.cudnn.{name} = {value!r}")
            return orig_setattr(this, name, value)

        self._patch(cls, "__setattr__", setattr_)

    def _install_dataloader(self, rec):
        from torch.utils.data import DataLoader
        orig_init = DataLoader.__init__

        @functools.wraps(orig_init)
        def init(this, *args, **kwargs):
            if kwargs.get("pin_memory"):
                rec("pin-memory", "DataLoader(pin_memory=True)", depth=2)
                kwargs["pin_memory"] = False
            return orig_init(this, *args, **kwargs)

        self._patch(DataLoader, "__init__", init)

    def _install_distributed(self, rec):
        from opscope.capture.ranks import install_remap
        install_remap(self, rec)

    def _install_load(self, rec):
        orig = torch.load

        @functools.wraps(orig)
        def load(*args, **kwargs):
            loc = kwargs.get("map_location")
            if loc is None or _is_cuda(loc):
                if loc is not None:
                    rec("cuda-load", "torch.load(map_location='cuda')")
                kwargs["map_location"] = "cpu"
            return orig(*args, **kwargs)

        self._patch(torch, "load", load)

    def uninstall(self) -> None:
        for owner, attr, old in reversed(self._undo):
            setattr(owner, attr, old)
        self._undo.clear()
