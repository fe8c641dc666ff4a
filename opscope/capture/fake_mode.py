"""``opscope scan --mode fake``: run the unmodified script with the model as fake tensors.

A full-size LLM cannot run here (a 7B model needs ~112 GB for fp32 weights, gradients and
AdamW state), but every ATen operator can be *dispatched* with shapes and dtypes and no data
(``torch._subclasses.fake_tensor.FakeTensorMode``) and the profiler still records it.

What is fake and what is real (``FakeRun``, a ``TorchDispatchMode`` over the whole script):

* **Fake**: factories (``empty``/``zeros``/``randn``...) run inside an ``nn.Module``'s
  construction (parameters, buffers), every ``nn.Parameter`` (its data is converted), any
  factory of ``factory_fake_mb`` or more, and every operator with a fake input (real inputs
  are converted) — so activations, gradients and optimizer state are fake.
* **Real**: everything else — DataLoader batches, tensors built from Python/numpy data,
  small synthetic batches, masks and position ids — so data-driven sizes (padding to the
  longest, a partial last batch) vary exactly as in a real run.

Values a fake tensor cannot give (``.item()``, ``bool(t)``, ``nonzero``, boolean masks...)
follow the documented policy of ``support_matrix/fake_mode.yaml``; each place it applied is
recorded with its source line (``places``) for the report.  The same mode tracks fake
storages' lifetimes for the memory fit (``MemoryTracker``).
"""
from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.atomic import write_atomic
from opscope.capture.run_folder import FAKE
from opscope.capture.source import iter_tensors
from opscope.knowledge import load as _load

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")


def policy() -> dict:
    return _load("fake_mode.yaml")


def _in_module_construction() -> bool:
    """Whether an ``nn.Module.__init__`` (or a method it calls) is on the stack."""
    frame: FrameType | None = sys._getframe(2)
    module_type = torch.nn.Module
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if isinstance(owner, module_type):
                return True
        frame = frame.f_back
    return False


class MemoryTracker:
    """Live bytes of fake storages per category; the peak of each step and where it happened.

    A storage is counted once (views share it) from its creation until its Python storage
    object is finalized (storage objects are preserved while any tensor uses them).

    Attention is counted as the NPU runs it (``fused_attention`` in fake_mode.yaml): torch_npu runs
    ``F.scaled_dot_product_attention`` as the fused FlashAttentionScore kernel, which keeps no
    batch x heads x Sq x Skv scores.  So the storages the CPU's SDPA makes inside itself (the math
    path's scores, softmax, dropout mask; the CPU flash kernel's logsumexp) are tracked but not
    counted (``uncounted``), its output is, and while its autograd graph lives the fused kernel's
    saved softmax statistics (and its output, which the NPU's backward reads) are.  In SDPA's
    backward only tensors of q's, k's or v's shape (the fused grad kernel's dq, dk, dv) are counted.
    """

    def __init__(self, user_code):
        self.user_code = user_code
        self.live: dict[int, list] = {}            # storage cdata -> [bytes counted, category, bytes not counted]
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak: dict[str, Any] = {"bytes": 0}
        self.steps: list[dict] = []
        self.module_stack: list[str] = []
        self.module_names: dict[int, str] = {}
        # fused attention (see the class docstring)
        self.stats_bytes_per_row = 0                # the fused kernel's saved statistics per query row
        self.inner: list[int] | None = None         # storages made inside the SDPA call running now
        self.attention_nodes: dict[int, frozenset] = {}   # SDPA's autograd nodes (sequence nr) -> dq/dk/dv shapes
        self.holds: dict[int, int] = {}             # SDPA output storage -> the saved storage that outlives it
        self.uncounted = 0                          # live bytes not counted (the CPU's attention intermediates)
        self.unfused_peak = 0                       # the peak had they been counted
        self.attention = {"calls": 0, "backward_calls": 0}

    def add(self, tensor, category: str) -> None:
        try:
            storage = tensor.untyped_storage()
            key = storage._cdata
        except Exception:  # not a plain strided tensor
            return
        if key in self.live:
            return
        size = int(storage.nbytes())
        if self.inner is not None or (self.attention_nodes and not self._kept_in_attention_backward(tensor)):
            self.live[key] = [0, category, size]
            self.uncounted += size
            if self.inner is not None:
                self.inner.append(key)
            weakref.finalize(storage, self._free, key)
            self.unfused_peak = max(self.unfused_peak, self.total + self.uncounted)
            return
        self.live[key] = [size, category, 0]
        self.totals[category] += size
        self.total += size
        weakref.finalize(storage, self._free, key)
        self.unfused_peak = max(self.unfused_peak, self.total + self.uncounted)
        if self.total > self.peak["bytes"]:
            self._new_peak()

    def _kept_in_attention_backward(self, tensor) -> bool:
        """Outside SDPA's backward: True.  Inside it: whether ``tensor`` has q's, k's or v's shape (what
        the fused grad kernel writes); the CPU's B x heads x Sq x Skv gradients are not counted."""
        node = torch._C._current_autograd_node()
        if node is None:
            return True
        try:
            shapes = self.attention_nodes.get(node._sequence_nr())
        except Exception:  # a Python-defined node
            return True
        return shapes is None or tuple(tensor.shape) in shapes

    def begin_attention(self) -> list[int] | None:
        outer, self.inner = self.inner, []
        return outer

    def end_attention(self, outer: list[int] | None, inputs: list, out) -> None:
        """The SDPA call is over: count its output, and while its graph lives the fused kernel's saved set."""
        inner, self.inner = self.inner or [], outer
        self.attention["calls"] += 1
        out_key = None
        try:
            out_key = out.untyped_storage()._cdata
        except Exception:
            pass
        entry = self.live.get(out_key) if out_key is not None else None
        if entry is not None and entry[2]:
            self.uncounted -= entry[2]
            entry[0], entry[2] = entry[2], 0
            self.totals[entry[1]] += entry[0]
            self.total += entry[0]
        saved = [k for k in inner if k != out_key and k in self.live]
        node = getattr(out, "grad_fn", None)
        if not saved or node is None:   # no graph (no_grad, eval): nothing is kept for a backward
            self._check_peak()
            return
        q = inputs[0]
        rows = q.numel() // max(int(q.shape[-1]), 1) if q.dim() else 1
        ghost = self.live[saved[0]]
        stats = rows * self.stats_bytes_per_row
        ghost[0] += stats
        self.totals[ghost[1]] += stats
        self.total += stats
        if out_key is not None and out_key in self.live:
            self.holds[out_key] = saved[0]
        self._mark_nodes(node, inputs)
        self._check_peak()

    def _mark_nodes(self, node, inputs: list) -> None:
        """SDPA's own autograd nodes: those created after its inputs' (sequence numbers above theirs)."""
        floor = -1
        for t in inputs:
            fn = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            if fn is not None:
                try:
                    floor = max(floor, fn._sequence_nr())
                except Exception:
                    pass
        shapes = frozenset(tuple(t.shape) for t in inputs[:3] if isinstance(t, torch.Tensor))
        todo, seen = [node], set()
        while todo:
            fn = todo.pop()
            try:
                seq = fn._sequence_nr()
            except Exception:
                continue
            if seq in seen or seq <= floor or seq >= 2**63:   # an input's node, or AccumulateGrad (max sequence nr)
                continue
            seen.add(seq)
            self.attention_nodes[seq] = shapes
            todo.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
        self.attention["backward_calls"] += 1

    def _check_peak(self) -> None:
        self.unfused_peak = max(self.unfused_peak, self.total + self.uncounted)
        if self.total > self.peak["bytes"]:
            self._new_peak()

    def claim(self, tensor, category: str) -> None:
        """``tensor``'s storage is (now) of ``category`` (a parameter, a gradient, optimizer state)."""
        try:
            entry = self.live.get(tensor.untyped_storage()._cdata)
        except Exception:
            return
        if entry is None:
            self.add(tensor, category)
        elif entry[1] != category:
            self.totals[entry[1]] -= entry[0]
            self.totals[category] += entry[0]
            entry[1] = category

    def _free(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is None:
            return
        self.uncounted -= entry[2]
        holder = self.live.get(self.holds.pop(key, -1))
        if holder is not None and entry[1] == holder[1]:   # SDPA's output: the NPU keeps it for the backward
            holder[0] += entry[0]
            return
        self.totals[entry[1]] -= entry[0]
        self.total -= entry[0]

    def _new_peak(self) -> None:
        where = self.user_code.frame_of(sys._getframe(3))
        node = torch._C._current_autograd_node()
        phase = "backward" if node is not None else ("forward" if self.module_stack else self.phase)
        self.peak = {"bytes": self.total, "breakdown": dict(self.totals), "phase": phase,
                     "where": f"{where[0]}:{where[1]}" if where else None,
                     "module": self.module_stack[-1] if self.module_stack else None,
                     "autograd_node": node.name() if node is not None else None}

    phase = "other"

    def end_step(self, index: int) -> None:
        self.steps.append(dict(self.peak, step=index, end_bytes=self.total, end_breakdown=dict(self.totals)))
        self.peak = {"bytes": self.total, "breakdown": dict(self.totals), "phase": "other", "where": None,
                     "module": None, "autograd_node": None}


_SDPA = torch.nn.functional.scaled_dot_product_attention


class _BoolProducers(TorchFunctionMode):
    """Tags the outputs of the Python calls named in ``bool_true_after`` (``torch.isfinite`` decomposes into
    other ATen ops, so the dispatch level cannot tell it); ``F.scaled_dot_product_attention`` goes to
    ``on_attention`` (its CPU decomposition is below the dispatch level's sight too)."""

    def __init__(self, names: frozenset, on_attention=None):
        super().__init__()
        self.names = names
        self.on_attention = on_attention

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _SDPA and self.on_attention is not None:
            return self.on_attention(func, args, kwargs or {})
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in self.names and isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            try:
                out._opscope_op = name   # type: ignore[attr-defined]
            except Exception:
                pass
        return out


class FakeRun(TorchDispatchMode):
    """The dispatch mode of ``--mode fake`` (see the module docstring)."""

    def __init__(self, user_code, probe: bool = False):
        super().__init__()
        self.probe = probe   # --mode auto's probe: stop at the model's first forward (parameters known)
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.fake_type = FakeTensor
        self.user_code = user_code
        self.rules = policy()
        self.factory_limit = int(self.rules.get("factory_fake_mb", 64)) * 2**20
        self.places: dict[tuple, dict] = {}
        self.memory = MemoryTracker(user_code)
        self.in_optimizer = False
        self._undo: list = []
        self._seen_modules: set[int] = set()
        self.optimizers: list[str] = []
        self.collectives: dict[tuple, dict] = {}   # (op, line) -> bytes per call, calls
        attention = self.rules.get("fused_attention") or {}
        self.memory.stats_bytes_per_row = int(attention.get("saved_bytes_per_query_row", 64))
        # repeated no-grad forwards: (module, inputs) -> its first outputs' shapes; what was not re-run
        self._eval_outputs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.skipped_forwards: dict[tuple, dict] = {}   # (module, line) -> calls not re-run
        self.may_skip = lambda: True    # whether a forward running now may be skipped (not being recorded)
        self._force_fake = False

    # -- install ---------------------------------------------------------------------
    def install(self) -> None:
        run = self
        param_new = torch.nn.Parameter.__new__

        def parameter_new(cls, data=None, requires_grad=True):
            if data is not None and not isinstance(data, run.fake_type):
                data = run.fake.from_tensor(data)   # shapes and dtypes, not the values
            param = param_new(cls, data, requires_grad)
            run.memory.add(param, "parameters")
            return param

        torch.nn.Parameter.__new__ = parameter_new   # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(torch.nn.Parameter, "__new__", param_new))
        swap = torch.utils.swap_tensors

        def swap_tensors(t1, t2):
            # Module.to()/.half() swaps fake parameters' Python objects, which the profiler's weak references
            # to recorded tensors forbid: give the parameter the converted data in place instead
            if isinstance(t1, run.fake_type) and isinstance(t2, run.fake_type):
                t1.data = t2.detach()
                return None
            return swap(t1, t2)

        torch.utils.swap_tensors = swap_tensors
        self._undo.append(lambda: setattr(torch.utils, "swap_tensors", swap))
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        handles = [register_module_forward_pre_hook(self._forward_pre), register_module_forward_hook(self._forward_post),
                   register_optimizer_step_pre_hook(self._optimizer_pre),
                   register_optimizer_step_post_hook(self._optimizer_post)]
        self._undo.extend(h.remove for h in handles)
        opt_init = Optimizer.__init__

        def optimizer_init(this, *args, **kwargs):
            run.optimizers.append(type(this).__name__)
            return opt_init(this, *args, **kwargs)

        Optimizer.__init__ = optimizer_init   # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(Optimizer, "__init__", opt_init))
        from torch.utils import _foreach_utils
        supported = _foreach_utils._foreach_supported_types
        if self.fake_type not in supported:   # clip_grad_norm_ & co. take their foreach path as on plain tensors
            supported.append(self.fake_type)
            self._undo.append(lambda: supported.remove(self.fake_type))
        self._install_distributed()
        save = torch.save

        def torch_save(obj, *args, **kwargs):
            if _holds_fake(obj, run.fake_type):   # a checkpoint of the fake model: nothing to write
                run._place("checkpoint-save", "torch.save", "skipped: nothing written (fake tensors carry no data)",
                           depth=2)
                return None
            return save(obj, *args, **kwargs)

        torch.save = torch_save
        self._undo.append(lambda: setattr(torch, "save", save))
        tagger = _BoolProducers(frozenset(self.rules.get("bool_true_after") or ()), self._attention)
        tagger.__enter__()
        self._undo.append(lambda: tagger.__exit__(None, None, None))
        if not self.probe:
            self._install_eval_skip()
        self.__enter__()

    def _install_distributed(self) -> None:
        """Collectives on fake tensors are shape-only no-ops whose sizes are recorded (communication
        volume); DistributedDataParallel of a fake model is its module, its gradient all-reduce recorded."""
        try:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:  # pragma: no cover - a torch without distributed
            return
        if not dist.is_available():
            return
        run = self
        for name in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "all_to_all", "all_to_all_single"):
            original = getattr(dist, name, None)
            if original is None:
                continue

            def collective(*args, _original=original, _name=name, **kwargs):
                fakes = [t for t in iter_tensors((args, kwargs)) if isinstance(t, run.fake_type)]
                if not fakes:
                    return _original(*args, **kwargs)
                run._collective(_name, sum(t.numel() * t.element_size() for t in fakes))
                return _DoneWork() if kwargs.get("async_op") else None

            setattr(dist, name, collective)
            self._undo.append(lambda _name=name, _original=original: setattr(dist, _name, _original))
        ddp_init, ddp_forward = DDP.__init__, DDP.forward

        def init(this, module, *args, **kwargs):
            if not any(isinstance(p, run.fake_type) for p in module.parameters()):
                return ddp_init(this, module, *args, **kwargs)
            torch.nn.Module.__init__(this)
            this.module = module
            this.require_backward_grad_sync = True
            this._opscope_fake = True
            found = run.user_code.frame_of(sys._getframe(1))
            where = f"{found[0]}:{found[1]}" if found else None
            size = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
            hooks: list = []

            def backward_done(*_):
                if this.require_backward_grad_sync:
                    run._collective("all_reduce (DistributedDataParallel gradient buckets)", size, where)

            params = [p for p in module.parameters() if p.requires_grad]
            if params:
                hooks.append(torch.autograd.graph.register_multi_grad_hook(params, backward_done, mode="all"))
            this._opscope_hooks = hooks
            return None

        def forward(this, *args, **kwargs):
            if getattr(this, "_opscope_fake", False):
                return this.module(*args, **kwargs)
            return ddp_forward(this, *args, **kwargs)

        DDP.__init__ = init   # type: ignore[method-assign,assignment]
        DDP.forward = forward   # type: ignore[method-assign,assignment]
        self._undo += [lambda: setattr(DDP, "__init__", ddp_init), lambda: setattr(DDP, "forward", ddp_forward)]

    def _collective(self, op: str, size: int, where: str | None = None) -> None:
        if where is None:
            found = self.user_code.frame_of(sys._getframe(2))
            where = f"{found[0]}:{found[1]}" if found else None
        entry = self.collectives.setdefault((op, where), {"op": op, "where": where, "bytes": size, "count": 0})
        entry["count"] += 1

    def uninstall(self) -> None:
        try:
            self.__exit__(None, None, None)
        except Exception:  # the script left another mode above ours
            pass
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    # -- model and optimizer boundaries ------------------------------------------------
    def _forward_pre(self, module, args) -> None:
        if not self.memory.module_stack and id(module) not in self._seen_modules:
            self._seen_modules.add(id(module))
            top = type(module).__name__
            for name, sub in module.named_modules():   # "LlamaForCausalLM.model.layers.3.mlp"
                self.memory.module_names.setdefault(id(sub), f"{top}.{name}" if name else top)
            for tensor in module.buffers():
                self.memory.claim(tensor, "parameters")
            for param in module.parameters():
                self.memory.claim(param, "parameters")
                if param.requires_grad and not getattr(param, "_opscope_grad_hook", False):
                    param.register_post_accumulate_grad_hook(self._grad_accumulated)
                    param._opscope_grad_hook = True
        if self.probe and not self.memory.module_stack:
            from opscope.capture.session import StopScan
            raise StopScan("probe: the model's first forward")
        self.memory.module_stack.append(self.memory.module_names.get(id(module), type(module).__name__))

    def _forward_post(self, module, args, output) -> None:
        if self.memory.module_stack:
            self.memory.module_stack.pop()

    def _grad_accumulated(self, param) -> None:
        if param.grad is not None:
            self.memory.claim(param.grad, "gradients")

    def _optimizer_pre(self, opt, args, kwargs) -> None:
        self.in_optimizer = True
        self.memory.phase = "optimizer"

    def _optimizer_post(self, opt, args, kwargs) -> None:
        self.in_optimizer = False
        self.memory.phase = "other"
        for state in opt.state.values():
            for tensor in iter_tensors(state):
                if isinstance(tensor, self.fake_type):
                    self.memory.claim(tensor, "optimizer_state")

    # -- attention as the NPU runs it ----------------------------------------------------
    def _attention(self, func, args, kwargs):
        """``F.scaled_dot_product_attention`` on fake tensors: its memory as torch_npu's fused kernel keeps it
        (``MemoryTracker``); the CPU still runs (and the profiler records) its own decomposition."""
        inputs = [*args[:4]] + [kwargs[k] for k in ("query", "key", "value", "attn_mask") if k in kwargs]
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        if len(tensors) < 3 or not any(isinstance(t, self.fake_type) for t in tensors):
            return func(*args, **kwargs)
        outer = self.memory.begin_attention()
        out = None
        try:
            out = func(*args, **kwargs)
        finally:
            if out is None:
                self.memory.inner = outer
        self.memory.end_attention(outer, tensors, out)
        return out

    # -- repeated no-grad forwards ---------------------------------------------------------
    def _install_eval_skip(self) -> None:
        """A top-level no-grad forward (evaluation, sampling) with inputs of shapes already seen is not
        re-run while the profiler is not recording it: its forward returns fake tensors of the first call's
        output shapes and dtypes.  The module's hooks still run (the session counts the forward)."""
        run = self
        call_impl = torch.nn.Module._call_impl

        def _call_impl(module, *args, **kwargs):
            if run.memory.module_stack or torch.is_grad_enabled():
                return call_impl(module, *args, **kwargs)
            return run._eval_call(call_impl, module, args, kwargs)

        torch.nn.Module._call_impl = _call_impl   # type: ignore[method-assign,assignment]
        self._undo.append(lambda: setattr(torch.nn.Module, "_call_impl", call_impl))

    def _eval_call(self, call_impl, module, args, kwargs):
        key = self._eval_key(module, args, kwargs)
        if key is None:
            return call_impl(module, *args, **kwargs)
        try:
            seen = self._eval_outputs.setdefault(module, {})
        except TypeError:   # a module that is not hashable or weakly referenceable
            return call_impl(module, *args, **kwargs)
        meta = seen.get(key)
        if meta is None:
            out = call_impl(module, *args, **kwargs)
            seen[key] = _output_meta(out, self.fake_type) or False
            return out
        if meta is False:   # outputs that cannot be rebuilt from shapes (real tensors, objects)
            return call_impl(module, *args, **kwargs)
        own = module.__dict__.get("forward", _MISSING)
        forward = module.forward
        run = self

        def skipped_forward(*a, **k):
            if not run.may_skip():
                return forward(*a, **k)
            run._skipped(module)
            return run._rebuild(meta)

        module.__dict__["forward"] = skipped_forward   # _call_impl reads self.forward before its hooks run
        try:
            return call_impl(module, *args, **kwargs)
        finally:
            if own is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = own

    def _eval_key(self, module, args, kwargs) -> tuple | None:
        """Shapes, dtypes and plain values of a forward's inputs, the module's mode and autocast's state;
        None when an input is an object (a cache, a config) the outputs could depend on otherwise."""
        from torch.utils._pytree import tree_flatten
        leaves, spec = tree_flatten((args, kwargs))
        parts: list = []
        fake = False
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                is_fake = isinstance(leaf, self.fake_type)
                fake = fake or is_fake
                parts.append((tuple(leaf.shape), leaf.dtype, leaf.device.type, is_fake))
            elif leaf is None or isinstance(leaf, (bool, int, float, str)):
                parts.append((type(leaf).__name__, leaf))
            else:
                return None
        if not fake and not isinstance(next(module.parameters(), None), self.fake_type):
            return None
        autocast: list = []
        for device in ("cpu", "cuda"):
            try:
                autocast.append((torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)))
            except Exception:  # a torch without that device's autocast
                autocast.append(None)
        return bool(module.training), str(spec), tuple(parts), tuple(autocast)

    def _skipped(self, module) -> None:
        found = self.user_code.frame_of(sys._getframe(2))
        where = f"{found[0]}:{found[1]}" if found else None
        name = self.memory.module_names.get(id(module), type(module).__name__)
        entry = self.skipped_forwards.setdefault((name, where), {"module": name, "where": where, "count": 0})
        entry["count"] += 1

    def _rebuild(self, meta):
        from torch.utils._pytree import tree_unflatten
        spec, leaves = meta
        out = []
        self._force_fake = True
        try:
            for leaf in leaves:
                if leaf[0] == "tensor":
                    _, shape, stride, dtype, device = leaf
                    out.append(torch.empty_strided(shape, stride, dtype=dtype, device=device))
                else:
                    out.append(leaf[1])
        finally:
            self._force_fake = False
        return tree_unflatten(out, spec)

    # -- the dispatch hook -------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fake_in = has_tensor = False
        for t in iter_tensors(args):
            has_tensor = True
            if isinstance(t, self.fake_type):
                fake_in = True
                break
        if not fake_in and kwargs:
            for t in iter_tensors(kwargs):
                has_tensor = True
                if isinstance(t, self.fake_type):
                    fake_in = True
                    break
        if not fake_in:
            if has_tensor:
                return func(*args, **kwargs)
            return self._factory(func, args, kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            return self._scalar(args[0])
        from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
        try:
            with self.fake:
                out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            out = self._bounded(func, args, kwargs)
        except DataDependentOutputException:
            if func._overloadpacket.__name__ in ("equal", "allclose", "is_nonzero"):
                return self._bool_read(func._overloadpacket.__name__, True)
            raise
        self._outputs(func, out)
        return out

    def _outputs(self, func, out) -> None:
        category = "optimizer_state" if self.in_optimizer else "activations"
        for t in iter_tensors(out):
            if isinstance(t, self.fake_type):
                self.memory.add(t, category)
                if t.dtype == torch.bool and t.numel() == 1 and not hasattr(t, "_opscope_op"):
                    try:
                        t._opscope_op = func._overloadpacket.__name__   # type: ignore[attr-defined]
                    except Exception:
                        pass

    def _factory(self, func, args, kwargs):
        """Parameters and buffers (built in a module's construction) and big tensors are fake."""
        if self._force_fake:   # the outputs of a forward that was not re-run
            with self.fake:
                made = func(*args, **kwargs)
            self._outputs(func, made)
            return made
        building = _in_module_construction()
        if not building:
            with self.fake:
                probe = func(*args, **kwargs)
            sizes = [t.untyped_storage().nbytes() for t in iter_tensors(probe) if isinstance(t, self.fake_type)]
            if not sizes or max(sizes) < self.factory_limit:
                return func(*args, **kwargs)
            self._outputs(func, probe)
            return probe
        with self.fake:
            out = func(*args, **kwargs)
        for t in iter_tensors(out):
            if isinstance(t, self.fake_type):
                self.memory.add(t, "parameters")
        return out

    # -- data-dependent values ----------------------------------------------------------
    def _place(self, kind: str, op: str, rule: str, value=None, depth: int = 3) -> None:
        found = self.user_code.frame_of(sys._getframe(depth))
        where = f"{found[0]}:{found[1]}" if found else None
        key = (kind, op, where)
        entry = self.places.get(key)
        if entry is None:
            entry = self.places[key] = {"kind": kind, "op": op, "where": where, "policy": rule, "count": 0}
            if value is not None:
                entry["value"] = value
        entry["count"] += 1

    def _scalar(self, tensor):
        if tensor.dtype == torch.bool:
            producer = getattr(tensor, "_opscope_op", None)
            return self._bool_read(producer, producer in set(self.rules.get("bool_true_after") or ()))
        values = self.rules.get("placeholders") or {}
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            value: Any = float(values.get("float", 1.0))
        else:
            value = int(values.get("int", 1))
        self._place("value-read", "aten::_local_scalar_dense", f"placeholder {value!r} (.item()/.tolist()/float()/int() "
                    "of a fake tensor)", value)
        return value

    def _bool_read(self, producer, true_after: bool):
        value = True if true_after else bool((self.rules.get("placeholders") or {}).get("bool", False))
        why = f"after aten::{producer}" if producer else "of a fake tensor"
        self._place("bool-read", f"aten::{producer}" if producer else "aten::_local_scalar_dense",
                    f"placeholder {value} (bool() {why})", value)
        return value

    def _bounded(self, func, args, kwargs):
        """A data-dependent output size gets its bound (``bounded_sizes`` in fake_mode.yaml)."""
        name = func._overloadpacket.__name__
        rules = self.rules.get("bounded_sizes") or {}
        if name not in rules:
            raise
        x = args[0]
        with self.fake:
            if name in ("nonzero", "argwhere"):
                out: Any = x.new_empty((x.numel(), x.dim()), dtype=torch.long)
            elif name == "masked_select":
                n = torch.broadcast_shapes(x.shape, args[1].shape).numel()
                out = x.new_empty((n,))
            elif name == "index":
                indices: list = []
                for idx in args[1]:
                    if idx is not None and idx.dtype in (torch.bool, torch.uint8):
                        indices.extend(idx.new_zeros((idx.numel(),), dtype=torch.long) for _ in range(idx.dim()))
                    else:
                        indices.append(idx)
                out = func(x, indices)
            elif name in ("_unique2", "unique_consecutive"):
                inverse = kwargs.get("return_inverse", args[2] if len(args) > 2 else False)
                counts = kwargs.get("return_counts", args[3] if len(args) > 3 else False)
                out = (x.new_empty((x.numel(),)), x.new_empty(x.shape if inverse else (0,), dtype=torch.long),
                       x.new_empty((x.numel(),) if counts else (0,), dtype=torch.long))
            elif name == "unique_dim":
                out = (x.new_empty(x.shape), x.new_empty((x.shape[args[1]],), dtype=torch.long),
                       x.new_empty((x.shape[args[1]],), dtype=torch.long))
            elif name == "bincount":
                out = x.new_empty((max(int(kwargs.get("minlength", 0) or 0), x.numel()),), dtype=torch.long)
            elif name == "repeat_interleave":
                size = kwargs.get("output_size") or x.numel()
                out = x.new_empty((size,), dtype=torch.long)
            else:  # pragma: no cover - every key of bounded_sizes has a branch
                raise NotImplementedError(name)
        self._place("data-dependent-size", f"aten::{name}", rules[name])
        return out

    # -- results ----------------------------------------------------------------------
    def on_step(self, index: int) -> None:
        self.memory.end_step(index)
        self.memory.attention_nodes.clear()

    def summary(self) -> dict:
        def order(place: dict) -> tuple:
            file, _, line = (place["where"] or "").rpartition(":")
            return file, int(line) if line.isdigit() else 0, place["kind"]

        memory = self.memory
        return {"places": sorted(self.places.values(), key=order),
                "memory": {"steps": memory.steps, "current": dict(memory.totals), "peak_now": memory.peak,
                           "fused_attention": {**memory.attention, "unfused_peak_bytes": memory.unfused_peak,
                                               "saved_bytes_per_query_row": memory.stats_bytes_per_row}},
                "skipped_forwards": sorted(self.skipped_forwards.values(), key=lambda e: (e["where"] or "", e["module"])),
                "optimizers": sorted(set(self.optimizers)),
                "collectives": list(self.collectives.values()),
                "factory_fake_mb": self.factory_limit // 2**20}

    def write(self, capture_dir: Path) -> None:
        write_atomic(Path(capture_dir) / FAKE, json.dumps(self.summary(), default=str))


def _holds_fake(obj, fake_type, depth: int = 0) -> bool:
    """Whether a (nested) state dict / list holds a fake tensor."""
    if isinstance(obj, fake_type):
        return True
    if depth >= 6:
        return False
    if isinstance(obj, dict):
        return any(_holds_fake(v, fake_type, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_fake(v, fake_type, depth + 1) for v in obj)
    if isinstance(obj, torch.nn.Module):
        return any(isinstance(p, fake_type) for p in obj.parameters())
    return False


_MISSING = object()


def _output_meta(out, fake_type) -> tuple | None:
    """(pytree spec, leaves) of a forward's outputs, each fake tensor as its shape, stride, dtype and device;
    None when an output is a real tensor or an object (not rebuilt from shapes)."""
    from torch.utils._pytree import tree_flatten
    leaves, spec = tree_flatten(out)
    metas: list[tuple] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if not isinstance(leaf, fake_type) or leaf.requires_grad:
                return None
            metas.append(("tensor", tuple(leaf.shape), tuple(leaf.stride()), leaf.dtype, leaf.device))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            metas.append(("value", leaf))
        else:
            return None
    return spec, metas


class _DoneWork:
    """What an ``async_op=True`` collective on fake tensors returns: already done."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True
