"""Written for `python -m torch.distributed.launch --nproc_per_node=8 ddp_launch_legacy.py` (legacy --local_rank)."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--crash-rank", type=int, default=-1)
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 1)).cuda()
    model = DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for it in range(args.iters):
        x = torch.randn(8, 16).cuda()
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == args.crash_rank and it == 1:
            raise ValueError(f"NaN loss on rank {dist.get_rank()}")


if __name__ == "__main__":
    main()
