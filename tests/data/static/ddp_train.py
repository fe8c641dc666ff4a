"""ImageNet-style DDP training script, written the way GPU training code is written.

Every CUDA-specific use below is listed in tests/test_static_scan.py (EXPECTED) with
its line: keep the two in step when editing this file.
"""
import argparse
import os
import time

import torch as t
import torch.distributed as dist
import torch.nn as nn
from torch.cuda import amp as cuda_amp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.cpp_extension import load

try:
    from apex import amp
    from apex.optimizers import FusedAdam
    from apex.normalization import FusedLayerNorm
except ImportError:
    amp = None
    FusedAdam = None
    FusedLayerNorm = nn.LayerNorm

import pynvml

roi_ops = load(name="roi_ops", sources=["csrc/roi_align.cpp", "csrc/roi_align_kernel.cu"], verbose=False)


def parse_args():
    parser = argparse.ArgumentParser(description="DDP training")
    parser.add_argument("--dist-backend", default="nccl", type=str)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--opt-level", default="O1")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.norm = FusedLayerNorm(128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x).relu()))


def main():
    args = parse_args()
    t.cuda.set_device(args.local_rank)
    dist.init_process_group(backend=args.dist_backend, init_method="env://")
    t.backends.cudnn.benchmark = True
    device = t.device(f"cuda:{args.local_rank}")

    data = TensorDataset(t.randn(256, 64), t.randint(0, 10, (256,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=4, pin_memory=True)

    model = Net().cuda()
    optimizer = FusedAdam(model.parameters(), lr=1e-3)
    if amp is not None:
        model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
    model = DDP(model, device_ids=[args.local_rank])
    scaler = cuda_amp.GradScaler()
    criterion = nn.CrossEntropyLoss().to(device)

    start = t.cuda.Event(enable_timing=True)
    end = t.cuda.Event(enable_timing=True)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        start.record()
        for images, target in loader:
            images = images.cuda(non_blocking=True)
            target = target.to("cuda", non_blocking=True)
            with cuda_amp.autocast():
                loss = criterion(model(images), target)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        end.record()
        t.cuda.synchronize()
        print(f"epoch {epoch}: {start.elapsed_time(end):.1f} ms, "
              f"{t.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    pynvml.nvmlInit()
    print(time.time())


if __name__ == "__main__":
    main()
