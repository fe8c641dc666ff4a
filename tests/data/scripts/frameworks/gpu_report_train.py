"""A training script that inspects its GPU the way training scripts and their utilities do before
training: device name, capability and memory for the log, bf16 support and TF32 for the dtype,
NCCL for the backend, RNG state saved around evaluation (fork_rng), CUDA events for timing,
memory statistics after each step.  It prints what it found as a JSON line after each step."""
import json

import torch
import torch.distributed as dist
import torch.nn as nn


def gpu_info():
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    return {
        "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability()),
        "total_memory": props.total_memory, "sms": props.multi_processor_count, "free": free,
        "bf16": torch.cuda.is_bf16_supported(), "nccl": dist.is_available() and dist.is_nccl_available(),
        "cuda_built": torch.backends.cuda.is_built(), "cudnn": torch.backends.cudnn.is_available(),
        "rng_state_bytes": int(torch.cuda.get_rng_state().numel()),
    }


def main():
    info = gpu_info()
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16 if info["bf16"] else torch.float16
    torch.backends.cuda.matmul.allow_tf32 = info["capability"][0] >= 8
    torch.cuda.manual_seed_all(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for step in range(6):
        x = torch.randn(32, 64, device=device)
        y = torch.randint(0, 10, (32,), device=device)
        start.record()
        with torch.autocast("cuda", dtype=dtype):
            info["autocast_on"] = torch.is_autocast_enabled("cuda")
            info["autocast_dtype"] = str(torch.get_autocast_dtype("cuda"))
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        info["step_ms"] = start.elapsed_time(end) >= 0
        info["peak"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.random.fork_rng(devices=[0]):
            torch.cuda.manual_seed(step)
        print("GPU-REPORT " + json.dumps(info), flush=True)


if __name__ == "__main__":
    main()
