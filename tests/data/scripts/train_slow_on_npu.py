"""A small vision-transformer-style trainer with the patterns that are slow on an NPU.

Hand-written attention (matmul-softmax-matmul), a hand-written RMSNorm, an int64
index_put that zeroes padded tokens, an MLP whose hidden size is 1000 (its second
matmul has K = 1000), plus a convolution patch embedding.
"""
import argparse

import torch
import torch.nn as nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, v)
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Net(nn.Module):
    def __init__(self, dim=256, heads=4, hidden=1000, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, kernel_size=8, stride=8)
        self.norm = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images, pad_index):
        x = self.stem(images).flatten(2).transpose(1, 2)
        x = x + self.attn(self.norm(x))
        x[:, pad_index] = 0.0
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.head(x.mean(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", "--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pad_index = torch.tensor([0, 5], dtype=torch.int64)
    for _ in range(args.steps):
        images = torch.randn(args.batch_size, 3, 128, 128)
        labels = torch.randint(0, 10, (args.batch_size,))
        loss = nn.functional.cross_entropy(model(images, pad_index), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
