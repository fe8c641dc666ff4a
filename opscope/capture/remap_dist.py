"""The distributed half of the CUDA->CPU remap, in every process of a scan without the script's GPUs.

``install_remap`` (called by ``CudaRemapper._install_distributed`` in ``remap.py``):
``init_process_group``/``new_group`` with NCCL run on gloo, at opscope's rendezvous port;
``DistributedDataParallel`` drops CUDA ``device_ids``; ``SyncBatchNorm`` runs on CPU tensors;
``torch.cuda.device_count()`` is the scan's world size.  Each of these is a run-time finding at
the user's line.
"""
from __future__ import annotations

import functools
import os
import re

from opscope.capture.devices import is_cuda
from opscope.capture.protocol import ENV_MASTER_PORT, ENV_WORLD_SIZE


def install_remap(remapper, rec) -> None:
    """Distributed part of the CUDA->CPU remap (see ``CudaRemapper._install_distributed``)."""
    import torch
    try:
        import torch.distributed as dist
    except Exception:  # pragma: no cover
        return
    world = int(os.environ.get(ENV_WORLD_SIZE, "0") or 0)
    if world:   # torch.cuda/torch.accelerator.device_count(): nprocs=device_count() spawns the world
        remapper.device_count = world
    if not dist.is_available():
        return
    remapper._patch(dist, "init_process_group", _gloo(dist.init_process_group, rec, "init_process_group", True))
    remapper._patch(dist, "new_group", _gloo(dist.new_group, rec, "new_group", False))
    from torch.nn.parallel import DistributedDataParallel as DDP
    orig_ddp = DDP.__init__

    @functools.wraps(orig_ddp)
    def ddp_init(this, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None and remapper._from_user():
            rec("ddp-device-ids", f"DistributedDataParallel(device_ids={device_ids!r})")
        return orig_ddp(this, module, None, None, *args, **kwargs)

    remapper._patch(DDP, "__init__", ddp_init)
    sync_bn = torch.nn.SyncBatchNorm
    orig_forward = sync_bn.forward

    @functools.wraps(orig_forward)
    def sync_bn_forward(this, input):
        if input.device.type == "cpu":   # SyncBatchNorm refuses CPU tensors once a process group exists
            rec("sync-batchnorm", "torch.nn.SyncBatchNorm")
            return torch.nn.modules.batchnorm._BatchNorm.forward(this, input)
        return orig_forward(this, input)

    remapper._patch(sync_bn, "forward", sync_bn_forward)
    orig_sync_check = getattr(DDP, "_passing_sync_batchnorm_handle", None)
    if orig_sync_check is not None:  # DDP refuses SyncBatchNorm in a CPU module

        def sync_check(this, module):
            if getattr(this, "device_type", None) != "cpu":
                return orig_sync_check(this, module)

        remapper._patch(DDP, "_passing_sync_batchnorm_handle", sync_check)


def _gloo(orig, rec, name: str, rendezvous: bool):
    """``orig`` with an NCCL backend replaced by gloo (and, in a distributed scan, opscope's port)."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args and name == "init_process_group" else None)
        if name == "new_group":
            backend = kwargs.get("backend", args[2] if len(args) > 2 else None)
        if isinstance(backend, str) and "nccl" in backend.lower():
            rec("nccl-backend", f"{name}(backend={backend!r})")
            if name == "init_process_group" and args:
                args = ("gloo",) + tuple(args[1:])
            elif name == "new_group" and len(args) > 2:
                args = tuple(args[:2]) + ("gloo",) + tuple(args[3:])
            else:
                kwargs["backend"] = "gloo"
        if rendezvous:
            args, kwargs = _local_rendezvous(args, kwargs)
            if is_cuda(kwargs.get("device_id")):   # eager init on a CUDA device (torch >= 2.3)
                rec("cuda-device", f"init_process_group(device_id={kwargs.pop('device_id')!r})")
        return orig(*args, **kwargs)
    return wrapper


def _local_rendezvous(args, kwargs):
    """Point tcp:// and env:// rendezvous at opscope's free local port (no collisions between scans)."""
    port = os.environ.get(ENV_MASTER_PORT)
    if not port or "store" in kwargs:
        return args, kwargs
    method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if isinstance(method, str) and method.startswith("tcp://"):
        method = re.sub(r"^tcp://[^/?]*", f"tcp://127.0.0.1:{port}", method)
        if "init_method" in kwargs or len(args) <= 1:
            kwargs["init_method"] = method
        else:
            args = (args[0], method) + tuple(args[2:])
    elif method is None or (isinstance(method, str) and method.startswith("env://")):
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = port
    return args, kwargs
