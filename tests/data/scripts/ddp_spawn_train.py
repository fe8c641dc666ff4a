"""DDP training launched with torch.multiprocessing.spawn, written for a multi-GPU node."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.LayerNorm([8, 8, 8])
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.norm(self.bn(self.conv(x))))
        return self.head(x.flatten(1))


def main_worker(rank, world_size, args):
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 3, 8, 8), torch.randint(0, 10, (args.samples,)))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = Net().cuda(rank)
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model, device_ids=[rank])
    criterion = nn.CrossEntropyLoss().cuda(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, target in loader:
            images = images.cuda(rank, non_blocking=True)
            target = target.cuda(rank, non_blocking=True)
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == args.crash_rank and step == args.crash_step:
                raise RuntimeError(f"rank {rank} lost its data shard")
            if rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--port", type=int, default=23456)
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    ngpus = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus, args=(ngpus, args))


if __name__ == "__main__":
    main()
