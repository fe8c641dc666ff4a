"""Run a GPU training script on a machine without a GPU, and record every CUDA API it used.

Only active when the scan runs on the CPU while the script asks for CUDA.  ``torch.cuda``
then answers as a CPU stand-in for the GPU the script was written for (an A100-class
device: ``device:``/``stand_in:`` in ``support_matrix/runtime_remaps.yaml``) to every
caller, the script and the frameworks it uses alike, so they take their GPU code path
(CUDA autocast and GradScaler run as their CPU counterparts in the requested dtype) while
every tensor stays on the CPU.  Each remap that fires becomes a ``Finding`` (origin
``runtime``) at the user's file:line, with the same rule ids as the static scan
(``support_matrix/cuda_api_rules.yaml``) so the two de-duplicate.  On a real GPU or NPU
nothing here is installed.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import types
from types import FrameType

import torch

from opscope.capture.devices import is_cuda
from opscope.model import Finding

# Whether a CUDA device exists is answered to torch itself (and opscope) as the machine is: only the
# script and the libraries it uses are told "yes".  torch code told "CUDA is available" takes CUDA paths
# for the CPU tensors it is handed (the optimizers' graph-capture check, DataParallel's replicas) and, on
# a CUDA build of torch without a GPU, reaches the CUDA driver.  Every other torch.cuda API (RNG state,
# memory, streams) answers as the stand-in to every caller: the real ones would start the runtime.
_MACHINE_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
                 os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def _asked_by_torch(frame: FrameType | None) -> bool:
    """Whether ``frame`` (the caller of a stand-in API) is torch's own code or opscope's."""
    return frame is not None and frame.f_code.co_filename.startswith(_MACHINE_DIRS)


# ... as a machine without a GPU, even when the scan runs on the CPU of one (``--device cpu``): every tensor is
# on the CPU, so torch must take its CPU paths.
_TORCH_SEES = {"is_available": False, "is_initialized": False, "device_count": 0}


class CudaRuntimeNeeded(RuntimeError, AssertionError):
    """A call that needs the CUDA runtime itself, which the CPU stand-in cannot answer (CUDA graphs, ...).

    Without a GPU the real call raises a RuntimeError (CUDA build) or an AssertionError ("Torch not compiled
    with CUDA enabled", CPU build): code that catches either still does.
    """


def _rules() -> dict:
    """rule id -> message, replacement, became, severity (``support_matrix/runtime_remaps.yaml``)."""
    from opscope.knowledge import load
    return load("runtime_remaps.yaml")["rules"]


def _stand_in() -> dict:
    """The device a CPU scan stands in for, and what each torch.cuda API answers (``runtime_remaps.yaml``)."""
    from opscope.knowledge import load
    data = load("runtime_remaps.yaml")
    return {"device": data.get("device") or {}, "apis": data.get("stand_in") or {}}


def _torch_self_probes() -> tuple[str, ...]:
    """Paths of torch modules that call torch.cuda on their own (``torch_self_probes`` in the yaml)."""
    from opscope.knowledge import load
    return tuple(load("runtime_remaps.yaml").get("torch_self_probes") or ())


def _torch_api(frame: FrameType | None) -> str:
    """The torch function a caller outside torch called, from the frame below it (``torch.cuda.graphs.CUDAGraph``)."""
    api = None
    while frame is not None and _asked_by_torch(frame):
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_MACHINE_DIRS[0]):
            module = "torch." + os.path.splitext(path[len(_MACHINE_DIRS[0]):])[0].replace(os.sep, ".")
            module = module.removesuffix(".__init__")
            api = f"{module}.{frame.f_code.co_qualname}".replace(".<module>", "")
        frame = frame.f_back
    return f"{api}()" if api else "a torch._C CUDA call"


def _runtime_needed(api: str) -> CudaRuntimeNeeded:
    return CudaRuntimeNeeded(f"{api} needs the CUDA runtime of a real GPU, which opscope's CPU stand-in cannot "
                             "answer; scan on a GPU machine (--device cuda) or keep this call out of the scanned steps")


def _library_of(filename: str) -> str | None:
    """Top-level package of a site-packages file (``transformers``), None for torch, opscope, stdlib."""
    norm = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in norm:
            top = norm.split(marker, 1)[1].split("/", 1)[0]
            top = top[:-3] if top.endswith(".py") else top
            return None if top in ("torch", "opscope", "typing_extensions") else top
    return None


class RuntimeFindings:
    """Collects remap findings keyed by (rule, file, line).

    A CUDA call made by a library (transformers, accelerate, Lightning ...) is answered the
    same way but recorded once per user line as ``framework-cuda`` naming the library and its
    calls: the script cannot change that code, but the report lists every remap.  Calls made
    by torch itself (``torch.manual_seed`` seeding CUDA too) are not the script's doing and
    are not listed.  ``precision`` keeps what the script (or its framework) asked autocast and
    GradScaler for, to compare with the dtypes the operators really ran in.
    """

    def __init__(self, user_code):
        self.user_code = user_code
        self.items: dict[tuple, Finding] = {}
        self._library_apis: dict[tuple, dict[str, list[str]]] = {}
        self._probes = _torch_self_probes()
        self.precision: dict = {"autocast": [], "grad_scaler": [], "libraries": []}
        self.answers: dict = {"device_count": 1}   # what the stand-in answers, for the ``became`` texts

    def caller(self, depth: int) -> tuple[str, tuple[str, int] | None, str | None]:
        """Who made the call ``depth`` frames up: ("user"|"library"|"torch", user file:line, library).

        Frames of torch (``Module.__call__``, ``torch.cuda.amp.autocast`` calling ``torch.autocast``)
        and of opscope are looked through, except torch modules that probe CUDA on their own
        (``torch.manual_seed`` seeding CUDA too, ``fork_rng``): then torch made the call, "torch".
        """
        probes = self._probes
        frame: FrameType | None = sys._getframe(depth + 1)
        who, library = None, None
        while frame is not None:
            filename = frame.f_code.co_filename
            shown = self.user_code.display(filename)
            if shown is not None:
                return who or "user", (shown, frame.f_lineno), library
            norm = filename.replace("\\", "/")
            if who is None:
                library = _library_of(filename)
                if library is not None:
                    who = "library"
                elif "/torch/" in norm and any(p in norm for p in probes):
                    who = "torch"
            frame = frame.f_back
        return who or "torch", None, library

    def record(self, rule: str, api: str, depth: int = 2, remapped: bool = True) -> None:
        who, where, library = self.caller(depth)
        if who == "torch":
            return
        if who == "library":
            self._record_library(rule, api, where, library or "?")
            return
        file, line = where if where else (None, None)
        key = (rule, file, line)
        found = self.items.get(key)
        if found:
            found.count += 1
            return
        spec = _rules()[rule]
        became = spec.get("became")
        if remapped and became and "{" in became:   # what the stand-in answered in this run
            became = became.format_map(self.answers)
        self.items[key] = Finding(rule=rule, file=file, line=line, api=api, message=spec["message"],
                                  replacement=spec.get("replacement"), severity=spec.get("severity", "warning"),
                                  origin="runtime", remapped_to=became if remapped else None,
                                  library=self.user_code.library_of(sys._getframe(depth)))

    def _record_library(self, rule: str, api: str, where, library: str) -> None:
        file, line = where if where else (None, None)
        key = ("framework-cuda", file, line)
        apis = self._library_apis.setdefault(key, {})
        calls = apis.setdefault(library, [])
        if api not in calls:
            calls.append(api)
        if library not in self.precision["libraries"]:
            self.precision["libraries"].append(library)
        text = "; ".join(f"{lib}: {', '.join(names)}" for lib, names in apis.items())
        found = self.items.get(key)
        if found:
            found.count += 1
            found.api = text
            return
        spec = _rules()["framework-cuda"]
        self.items[key] = Finding(rule="framework-cuda", file=file, line=line, api=text, message=spec["message"],
                                  replacement=spec.get("replacement"), severity=spec.get("severity", "info"),
                                  origin="runtime", remapped_to=spec.get("became"))

    def list(self) -> list[Finding]:
        return list(self.items.values())


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

    def is_capturing(self):
        return False

    cuda_stream = 0
    priority = 0
    device = None


class _FakeProps:
    """torch.cuda.get_device_properties() of the stand-in device (values from ``device:`` in the yaml)."""

    def __init__(self, device: dict):
        self.name = str(device.get("name", "CUDA device (opscope CPU stand-in)"))
        self.major, self.minor = (list(device.get("capability") or [8, 0]) + [0, 0])[:2]
        self.total_memory = int(device.get("total_memory", 0))
        self.multi_processor_count = int(device.get("multi_processor_count", 0))
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = 0
        self.uuid = "opscope-cpu-stand-in"

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count={self.multi_processor_count})")


def _register_as_torch_bases(event: type, stream: type) -> None:
    """torch 2.2-2.5's dynamo asserts that torch.cuda.Event/Stream derive from its abstract bases when it is
    first imported (by the optimizers, after the stand-in is in place): register the stand-ins with them."""
    try:
        from torch._streambase import _EventBase, _StreamBase  # type: ignore[import-not-found,unused-ignore]
    except ImportError:   # no such module
        return
    for base, cls in ((_EventBase, event), (_StreamBase, stream)):
        register = getattr(base, "register", None)   # an ABC (torch 2.2-2.5); later torch keeps plain aliases
        if register is not None:
            register(cls)


def _answers(remapper, device: dict) -> dict:
    """What each answer name of ``stand_in:`` returns (a value, or a callable of the call's arguments)."""
    props = _FakeProps(device)
    return {
        "true": lambda *a, **k: True,
        "false": lambda *a, **k: False,
        "none": lambda *a, **k: None,
        "zero": lambda *a, **k: 0,
        "world_size": lambda *a, **k: remapper.device_count,
        "device_index": lambda *a, **k: 0,
        "device_name": lambda *a, **k: props.name,
        "capability": lambda *a, **k: (props.major, props.minor),
        "properties": lambda *a, **k: props,
        "bf16": lambda *a, **k: bool(device.get("bf16_supported", True)),
        "empty_dict": lambda *a, **k: {},
        "empty_string": lambda *a, **k: "",
        "rng_state": lambda *a, **k: torch.get_rng_state(),
        "rng_states": lambda *a, **k: [torch.get_rng_state() for _ in range(remapper.device_count)],
        "initial_seed": lambda *a, **k: torch.initial_seed(),
        "stream": lambda *a, **k: _FakeStream(),
        "null_context": lambda *a, **k: contextlib.nullcontext(),
        "mem_info": lambda *a, **k: (props.total_memory, props.total_memory),
        "arch_list": lambda *a, **k: list(device.get("arch_list") or []),
    }


class CudaRemapper:
    """Installs CUDA->CPU patches; ``on_call`` rewrites device args of torch calls."""

    def __init__(self, findings: RuntimeFindings):
        self.findings = findings
        self.user_code = findings.user_code
        self._undo: list = []
        self._cuda_modules: list | None = None   # torch.cuda's submodules, listed once (_patch_everywhere)
        self.moved = False
        self.targets_cuda = False   # the script put something on the GPU: its optimizers take the GPU's path

    @property
    def device_count(self) -> int:
        """What ``device_count()`` answers: the world size (1 unless a launcher started several processes)."""
        return self.findings.answers["device_count"]

    @device_count.setter
    def device_count(self, count: int) -> None:
        self.findings.answers["device_count"] = count   # the finding's text says what was answered

    # -- called by SourceTracker for every torch call --------------------------------
    def on_call(self, func, args, kwargs):
        """Rewrite CUDA device arguments; ``self.moved`` says whether this call targeted CUDA."""
        name = getattr(func, "__name__", "")
        self.moved = False
        if name == "cuda":
            self.moved = self.targets_cuda = True
            self.findings.record("cuda-call", "Tensor.cuda()", depth=3)
            return args, kwargs, True, args[0]
        dev = kwargs.get("device")
        if dev is not None and is_cuda(dev):
            self.moved = self.targets_cuda = True
            kwargs = dict(kwargs, device="cpu")
            self.findings.record("cuda-device", f"{name}(device='cuda')", depth=3)
        if name == "to" and len(args) > 1 and is_cuda(args[1]):
            self.moved = self.targets_cuda = True
            args = (args[0], "cpu") + tuple(args[2:])
            self.findings.record("cuda-device", ".to('cuda')", depth=3)
        if name == "pin_memory":
            self.findings.record("pin-memory", "Tensor.pin_memory()", depth=3)
            return args, kwargs, True, args[0]
        return args, kwargs, False, None

    def _request(self, what: str, value: str) -> None:
        """Remember a precision request (autocast dtype, GradScaler on/off) for the precision check."""
        seen = self.findings.precision.setdefault(what, [])
        if value not in seen:
            seen.append(value)

    # -- module-level patches ---------------------------------------------------------
    def _patch(self, owner, attr, value):
        old = getattr(owner, attr, None)
        self._undo.append((owner, attr, old))
        setattr(owner, attr, value)

    def _patch_everywhere(self, owner, attr, value) -> None:
        """Patch ``owner.attr`` and every ``torch.cuda`` submodule that imported the same object by name.

        ``torch.cuda.memory`` and ``torch.cuda.random`` bind ``_lazy_init`` and re-export the memory and
        RNG functions under their own names: a caller reaching them there must get the same answer.
        """
        old = getattr(owner, attr, None)
        self._patch(owner, attr, value)
        if old is None:
            return
        if self._cuda_modules is None:
            self._cuda_modules = [module for name, module in list(sys.modules.items())
                                  if name.startswith("torch.cuda.") and module is not None]
        for module in self._cuda_modules:
            if module is not owner and getattr(module, attr, None) is old:
                self._patch(module, attr, value)

    def _from_user(self, depth=2) -> bool:
        frame = sys._getframe(depth)
        return self.user_code.display(frame.f_code.co_filename) is not None

    def install(self) -> None:
        """torch.cuda answers as the stand-in device (``runtime_remaps.yaml``: device, stand_in) to every caller."""
        cuda = torch.cuda
        rec = self.findings.record
        data = _stand_in()
        self.device = data["device"]
        answers = _answers(self, self.device)

        def fake(rule, api, answer):
            def fn(*args, **kwargs):
                if api in _TORCH_SEES and _asked_by_torch(sys._getframe(1)):
                    return _TORCH_SEES[api]
                rec(rule, f"torch.cuda.{api}()", depth=2)
                return answer(*args, **kwargs)
            fn.__name__ = api
            return fn

        for api, (rule, answer) in data["apis"].items():
            self._patch_everywhere(cuda, api, fake(rule, api, answers[str(answer).lower()]))

        # classes, not functions: libraries use them in annotations (`torch.cuda.Stream | None`)
        class event(_FakeEvent):
            def __init__(self, *args, **kwargs):
                rec("cuda-event", "torch.cuda.Event()")
                super().__init__()

        class stream(_FakeStream):
            def __init__(self, *args, **kwargs):
                rec("cuda-stream", "torch.cuda.Stream()")
                super().__init__()

        _register_as_torch_bases(event, stream)
        self._patch(cuda, "Event", event)
        self._patch(cuda, "Stream", stream)
        self._install_backends(rec)
        self._install_accelerator(rec)
        self._install_module(rec)
        self._install_amp(rec)
        self._install_cudnn(rec)
        self._install_dataloader(rec)
        self._install_distributed(rec)
        self._install_load(rec)
        self._install_data_parallel(rec)
        self._install_graphs(rec)
        self._install_optimizers()
        self._install_runtime_guard(rec)

    def _install_backends(self, rec):
        """``torch.backends.cuda.is_built()``, cuDNN availability/version, NCCL availability: as on the GPU machine."""
        device = self.device
        backends = torch.backends

        def built(*args, **kwargs):
            if _asked_by_torch(sys._getframe(1)):
                return orig_built(*args, **kwargs)
            rec("cuda-is-available", "torch.backends.cuda.is_built()", depth=2)
            return True

        orig_built = backends.cuda.is_built
        self._patch(backends.cuda, "is_built", built)
        orig_cudnn_available, orig_cudnn_version = backends.cudnn.is_available, backends.cudnn.version

        def cudnn_available():
            return orig_cudnn_available() if _asked_by_torch(sys._getframe(1)) else True

        def cudnn_version():
            if _asked_by_torch(sys._getframe(1)):
                return orig_cudnn_version()
            return int(device.get("cudnn_version", 0)) or None

        self._patch(backends.cudnn, "is_available", cudnn_available)
        self._patch(backends.cudnn, "version", cudnn_version)
        try:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d
        except Exception:  # pragma: no cover
            return
        if device.get("nccl_available", True) and hasattr(c10d, "is_nccl_available"):
            orig_nccl = c10d.is_nccl_available

            def nccl(*args, **kwargs):
                if _asked_by_torch(sys._getframe(1)):   # the default backend map: gloo for CPU tensors
                    return orig_nccl(*args, **kwargs)
                rec("nccl-available", "torch.distributed.is_nccl_available()", depth=2)
                return True
            for owner in (dist, c10d):
                if hasattr(owner, "is_nccl_available"):
                    self._patch(owner, "is_nccl_available", nccl)

    def _install_accelerator(self, rec):
        """``torch.accelerator`` (torch >= 2.6): report a CUDA accelerator, remapped like torch.cuda."""
        acc = getattr(torch, "accelerator", None)
        if acc is None:
            return

        def fake(api, result=None):
            original = getattr(acc, api, None)

            def fn(*args, **kwargs):
                # the script and its libraries see the stand-in; torch's own internals keep the real answer
                if original is not None and _asked_by_torch(sys._getframe(1)):
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
                 "device_index": lambda: contextlib.nullcontext(), "current_stream": _FakeStream,
                 "get_memory_info": lambda: (0, 0)}
        for api, result in table.items():
            if hasattr(acc, api):
                self._patch(acc, api, fake(api, result))

    def _install_module(self, rec):
        """Module.cuda()/.to('cuda') on modules without tensors never reach a torch call."""
        module_cls = torch.nn.Module
        orig_to = module_cls.to

        def mark(module):
            self.targets_cuda = True
            for t in list(module.parameters()) + list(module.buffers()):
                t._opscope_dev = True  # "on the accelerator" in the original script

        def cuda_(this, device=None):
            rec("cuda-call", "Module.cuda()")
            mark(this)
            return this

        def to_(this, *args, **kwargs):
            if any(is_cuda(a) for a in args) or is_cuda(kwargs.get("device")):
                rec("cuda-device", "Module.to('cuda')")
                args = tuple(f"cuda:{a}" if is_cuda(a) and isinstance(a, int) else a for a in args)
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
                dtype = dtype or torch.float16   # CUDA autocast's default; CPU autocast's is bfloat16
                name = str(dtype).replace("torch.", "")
                rec("cuda-amp-autocast", f"torch.autocast('cuda', dtype={name})", depth=2)
                if enabled:
                    self._request("autocast", name)
                device_type = "cpu"
            elif device_type == "cpu" and enabled:   # a framework that saw no GPU takes its CPU path
                who, _, library = self.findings.caller(1)
                if who == "library" and library:
                    name = str(dtype or torch.get_autocast_dtype("cpu")).replace("torch.", "")
                    self._request("cpu_autocast", f"{library} ({name})")
            return orig_init(this, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

        self._patch(autocast_mode.autocast, "__init__", autocast_init)
        orig_scaler = grad_scaler.GradScaler.__init__

        @functools.wraps(orig_scaler)
        def scaler_init(this, device="cuda", *args, **kwargs):
            if device == "cuda":
                rec("cuda-amp-gradscaler", "GradScaler('cuda')", depth=2)
                enabled = kwargs.get("enabled", args[4] if len(args) > 4 else True)
                self._request("grad_scaler", "enabled" if enabled else "disabled")
                device = "cpu"
            return orig_scaler(this, device, *args, **kwargs)

        self._patch(grad_scaler.GradScaler, "__init__", scaler_init)
        # "is CUDA autocast on, in which dtype?": the CPU autocast that stands in for it answers
        orig_enabled, orig_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype

        def is_autocast_enabled(device_type=None):
            return orig_enabled("cpu" if device_type in (None, "cuda") else device_type)

        def get_autocast_dtype(device_type):
            return orig_dtype("cpu" if device_type == "cuda" else device_type)

        self._patch(torch, "is_autocast_enabled", is_autocast_enabled)
        self._patch(torch, "get_autocast_dtype", get_autocast_dtype)
        self._patch(torch, "get_autocast_gpu_dtype", lambda: orig_dtype("cpu"))
        orig_available = getattr(autocast_mode, "is_autocast_available", None)
        if orig_available is not None:
            self._patch(autocast_mode, "is_autocast_available",
                        lambda device_type: device_type == "cuda" or orig_available(device_type))
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
        from opscope.capture.remap_dist import install_remap
        install_remap(self, rec)

    def _install_load(self, rec):
        orig = torch.load

        @functools.wraps(orig)
        def load(*args, **kwargs):
            loc = kwargs.get("map_location")
            if loc is None or is_cuda(loc):
                if loc is not None:
                    rec("cuda-load", "torch.load(map_location='cuda')")
                kwargs["map_location"] = "cpu"
            return orig(*args, **kwargs)

        self._patch(torch, "load", load)

    def _install_data_parallel(self, rec):
        """``nn.DataParallel`` runs as one replica and is listed as a change to make (Ascend has no DataParallel).

        torch sees no GPU (``_asked_by_torch``), so DataParallel keeps no device ids and its forward calls the
        module itself, in this process, as it does on a CPU-only machine.
        """
        from torch.nn.parallel import DataParallel
        orig_init = DataParallel.__init__

        @functools.wraps(orig_init)
        def init(this, *args, **kwargs):
            rec("data-parallel", "torch.nn.DataParallel()", depth=2)
            return orig_init(this, *args, **kwargs)

        self._patch(DataParallel, "__init__", init)

    def _install_graphs(self, rec):
        """CUDA graphs: ``make_graphed_callables`` gives back the eager callables (a graph replays the same
        operators); capturing one by hand (``CUDAGraph``, ``torch.cuda.graph``) cannot be stood in and stops
        with one line (both are classes: libraries name them in annotations)."""
        cuda = torch.cuda

        def refuse(api):
            rec("cuda-graph", api, depth=3)
            raise _runtime_needed(api)

        class CUDAGraph:
            def __init__(self, *args, **kwargs):
                refuse("torch.cuda.CUDAGraph()")

        class graph:
            def __init__(self, *args, **kwargs):
                refuse("torch.cuda.graph()")

        def graph_pool_handle(*args, **kwargs):
            refuse("torch.cuda.graph_pool_handle()")

        def make_graphed_callables(callables, *args, **kwargs):
            rec("cuda-graph", "torch.cuda.make_graphed_callables()", depth=2)
            return callables

        for name, value in (("CUDAGraph", CUDAGraph), ("graph", graph), ("graph_pool_handle", graph_pool_handle),
                            ("make_graphed_callables", make_graphed_callables)):
            if hasattr(cuda, name):
                self._patch_everywhere(cuda, name, value)
        nvtx = getattr(cuda, "nvtx", None)   # NVTX ranges: no-ops (the CPU build has no NVTX at all)
        for name in ("range_push", "range_pop", "range_start", "range_end", "mark", "range"):
            if nvtx is not None and hasattr(nvtx, name):
                self._patch(nvtx, name, self._nvtx_stand_in(rec, name))

    @staticmethod
    def _nvtx_stand_in(rec, name: str):
        def fn(*args, **kwargs):
            rec("cuda-nvtx", f"torch.cuda.nvtx.{name}()", depth=2)
            return contextlib.nullcontext() if name == "range" else 0
        return fn

    def _install_optimizers(self) -> None:
        """torch's optimizers pick their implementation as for the GPU's tensors: foreach, not the loop.

        With neither ``foreach`` nor ``fused`` given, SGD, Adam, AdamW and the others run the foreach
        implementation (``_foreach_add_``, ``_foreach_mul_``, ...) on CUDA tensors (and on the NPU's
        PrivateUse1 ones), the per-parameter loop on CPU tensors
        (``torch.optim.optimizer._default_to_fused_or_foreach``).  On the stand-in the parameters the
        script put on the GPU are CPU tensors: they get the GPU's answer, and torch's CPU foreach kernels
        run.  ``fused=True`` (nanoGPT's and the HF Trainer's AdamW on CUDA) needs nothing: torch runs the
        fused kernels on the CPU too.  Each optimizer module bound the function by name: each is patched.
        """
        try:
            from torch.optim import optimizer as optim_base
            from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
        except ImportError:  # pragma: no cover - older torch
            return
        orig = getattr(optim_base, "_default_to_fused_or_foreach", None)
        if orig is None or "cpu" in _get_foreach_kernels_supported_devices():
            return
        supported = getattr(optim_base, "_foreach_supported_types", (torch.Tensor, torch.nn.Parameter))
        remapper = self

        def default_to_fused_or_foreach(params, differentiable, use_fused=False):
            fused, foreach = orig(params, differentiable, use_fused)
            if fused or foreach or differentiable or torch.jit.is_scripting() or not params:
                return fused, foreach
            if all(p is None or ((type(p) in supported or _is_fake(p)) and p.device.type == "cpu"
                                 and (getattr(p, "_opscope_dev", False) or remapper.targets_cuda))
                   for p in params):
                return False, True
            return fused, foreach

        def _is_fake(p) -> bool:
            """--mode fake: a fake tensor stands for the GPU's parameter and takes its path too."""
            fake = sys.modules.get("torch._subclasses.fake_tensor")   # imported wherever a fake tensor exists
            return fake is not None and bool(fake.is_fake(p))

        default_to_fused_or_foreach.__wrapped__ = orig   # type: ignore[attr-defined]
        for name, module in list(sys.modules.items()):
            if module is not None and (name == "torch.optim" or name.startswith("torch.optim.")) \
                    and getattr(module, "_default_to_fused_or_foreach", None) is orig:
                self._patch(module, "_default_to_fused_or_foreach", default_to_fused_or_foreach)

    def _install_runtime_guard(self, rec):
        """What would still start the CUDA runtime (CUDA graphs, ``torch._C._cuda_*``) stops with one clear line.

        torch starts CUDA through ``torch.cuda._lazy_init`` (its C++ side calls the Python function too).
        Without a GPU the real one dies with a driver error (CUDA build) or "not compiled with CUDA" (CPU
        build); this one names the call that needed the runtime and is listed as a finding at its line.
        """
        def lazy_init(*args, **kwargs):
            api = _torch_api(sys._getframe(1))
            rec("cuda-runtime", api, depth=2, remapped=False)
            raise _runtime_needed(api)

        self._patch_everywhere(torch.cuda, "_lazy_init", lazy_init)
        runtime_error = getattr(torch, "AcceleratorError", RuntimeError)

        def guarded(name, real):
            # torch._C._cuda_* reach the runtime from C++ without _lazy_init: a call that fails there is named
            @functools.wraps(real)
            def call(*args, **kwargs):
                try:
                    return real(*args, **kwargs)
                except RuntimeError as exc:
                    if not isinstance(exc, runtime_error) and "CUDA" not in str(exc):
                        raise
                    rec("cuda-runtime", f"torch._C.{name}()", depth=2, remapped=False)
                    raise _runtime_needed(f"torch._C.{name}()") from None
            return call

        for name in dir(torch._C):
            real = getattr(torch._C, name)
            if name.startswith("_cuda_") and isinstance(real, types.BuiltinFunctionType):
                self._patch(torch._C, name, guarded(name, real))

    def uninstall(self) -> None:
        for owner, attr, old in reversed(self._undo):
            setattr(owner, attr, old)
        self._undo.clear()
