"""Multi-GPU training in the idioms of public examples (ImageNet, MNIST, a TVM-tuned op)."""
import argparse
import logging

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.data as tud
import tvm

log = logging.getLogger("train")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--tvm-target", default="cuda")
    p.add_argument("--gpu", type=int, default=0)
    return p.parse_args()


def pick_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def loaders(data, use_cuda):
    train_kwargs = {"batch_size": 64}
    cuda_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
    if use_cuda:
        train_kwargs.update(cuda_kwargs)
    train = tud.DataLoader(data, **train_kwargs)
    extra = dict(pin_memory=True, drop_last=True)
    test = tud.DataLoader(data, batch_size=256, **extra)
    return train, test


def main():
    args = parse()
    gpu = args.gpu
    torch.cuda.set_device(gpu)
    device = torch.device("cuda:{}".format(gpu))
    replica = torch.device(f"cuda:{gpu + 1}")
    spare = torch.zeros(1, device="cuda:%d" % gpu)
    if dist.is_nccl_available():
        dist.init_process_group("nccl")
    log.info("NCCL %s, CUDA %s", torch.cuda.nccl.version(), torch.version.cuda)
    model = nn.Linear(8, 2).to(args.device)
    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    train, test = loaders(data, use_cuda=True)
    stats = {"cuda": 0.0, "cpu": 0.0}
    target = tvm.target.Target("cuda")
    lib = tvm.build(tvm.te.create_schedule([]), target=args.tvm_target)
    log.info("training on %s", "cuda")
    for x, y in train:
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.to(pick_device())
        if x.device.type == "cuda" and x.is_cuda:
            stats["cuda"] += 1
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    print(f"done on cuda:{gpu}", replica, spare, target, lib, test)


if __name__ == "__main__":
    main()
