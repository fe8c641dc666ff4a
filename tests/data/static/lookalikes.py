"""User code whose names merely look like CUDA APIs: none of this is CUDA-specific."""
import numpy as np

import myproject.utils as utils
from myproject.backends import synchronize


def cuda(x):
    """A local helper that happens to be called `cuda`."""
    return x


class Timer:
    def synchronize(self):
        return None

    def is_available(self):
        return True


def train_step(batch, amp=None, torch=None):
    # parameters shadow the usual module names
    if amp is not None:
        amp.initialize(batch)
    if torch is not None:
        torch.cuda.synchronize()
    return batch


def main():
    timer = Timer()
    timer.synchronize()
    out = cuda(np.zeros(3))
    utils.cuda(out)
    synchronize()
    mode = "cudagraph-off"
    label = "the nccl backend is not used here"
    return out, mode, label, train_step([1])


main()
