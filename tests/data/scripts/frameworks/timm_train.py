"""timm's train.py, shortened (huggingface/pytorch-image-models): argparse with --amp/--amp-dtype and a
--local_rank default, utils.init_distributed_device (DDP only when launched with WORLD_SIZE > 1),
timm.create_model, create_optimizer_v2, NativeScaler and torch.autocast.  Synthetic 32x32 images."""
import argparse
import os
from contextlib import suppress
from functools import partial

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader, TensorDataset

import timm
from timm import utils
from timm.optim import create_optimizer_v2

parser = argparse.ArgumentParser(description='PyTorch ImageNet Training')
parser.add_argument('--model', default='resnet10t', type=str)
parser.add_argument('--num-classes', type=int, default=10)
parser.add_argument('-b', '--batch-size', type=int, default=8)
parser.add_argument('--img-size', type=int, default=32)
parser.add_argument('--opt', default='sgd', type=str)
parser.add_argument('--lr', type=float, default=0.05)
parser.add_argument('--momentum', type=float, default=0.9)
parser.add_argument('--weight-decay', type=float, default=2e-5)
parser.add_argument('--epochs', type=int, default=2)
parser.add_argument('--amp', action='store_true', default=False, help='use NVIDIA Apex AMP or Native AMP')
parser.add_argument('--amp-dtype', default='float16', type=str)
parser.add_argument('--device', default='cuda', type=str)
parser.add_argument('--channels-last', action='store_true', default=False)
parser.add_argument("--local_rank", default=0, type=int)


def main():
    args = parser.parse_args()
    device = utils.init_distributed_device(args)
    if args.distributed:
        print(f'Training in distributed mode, process {args.rank}, total {args.world_size}, device {args.device}.')
    else:
        print(f'Training with a single process on 1 device ({args.device}).')
    assert args.rank >= 0
    amp_autocast = suppress
    loss_scaler = None
    if args.amp:
        amp_dtype = torch.bfloat16 if args.amp_dtype == 'bfloat16' else torch.float16
        amp_autocast = partial(torch.autocast, device_type=device.type, dtype=amp_dtype)
        if device.type in ('cuda',) and amp_dtype == torch.float16:
            loss_scaler = utils.NativeScaler(device=device.type)
    utils.random_seed(42, args.rank)
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes)
    model.to(device=device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay,
                                    momentum=args.momentum)
    if args.distributed:
        model = NativeDDP(model, device_ids=[device])
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(64, 3, args.img_size, args.img_size, generator=g),
                            torch.randint(0, args.num_classes, (64,), generator=g))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0, pin_memory=True,
                        drop_last=True)
    train_loss_fn = nn.CrossEntropyLoss().to(device=device)
    for epoch in range(args.epochs):
        model.train()
        for input, target in loader:
            input, target = input.to(device), target.to(device)
            with amp_autocast():
                output = model(input)
                loss = train_loss_fn(output, target)
            optimizer.zero_grad()
            if loss_scaler is not None:
                loss_scaler(loss, optimizer, parameters=model.parameters())
            else:
                loss.backward()
                optimizer.step()
            if device.type == 'cuda':
                torch.cuda.synchronize()
        if utils.is_primary(args):
            print(f'epoch {epoch} loss {loss.item():.4f}')


if __name__ == '__main__':
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    main()
