"""Which torch device the backend computes on, and how much of its memory the KV pool may take.

vLLM's convention: --gpu-memory-utilization is the fraction of the device's total memory the whole process
may use (weights, activations, CUDA graphs and the pool); the pool gets what that leaves after the weights
are loaded. On a CPU the paged cache's own default (a quarter of the available RAM) applies.
"""

from __future__ import annotations

import torch

from engine_builder.formats.device_plan import check_utilization
from engine_builder.runner.kv.block_pool import available_ram
from engine_builder.runner.tunables import ACTIVATION_RESERVE, DEFAULT_GPU_MEMORY_UTILIZATION, HOST_KV_RAM_FRACTION
from engine_builder.util.errors import InputError


def torch_device() -> torch.device:
    """CUDA device 0 where a GPU is present (LOCAL_RANK's under torchrun), else the CPU."""
    if torch.cuda.is_available():
        import os

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def device_memory_budget(device: torch.device, utilization: float | None = None) -> int:
    """Bytes the KV pool may take on DEVICE, after what is already allocated (the weights)."""
    if utilization is not None:
        check_utilization(utilization)
    if device.type != "cuda":
        return int(available_ram() * HOST_KV_RAM_FRACTION)
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization
    free, total = torch.cuda.mem_get_info(device)
    # the process may hold utilization x total: what it and others hold already is gone from free
    budget = free - int(total * (1 - utilization)) - ACTIVATION_RESERVE
    if budget <= 0:
        raise InputError(f"--gpu-memory-utilization {utilization} leaves no room for the KV cache on "
                         f"{torch.cuda.get_device_name(device)} ({free / 2**30:.1f} of {total / 2**30:.1f} GiB "
                         "free); raise it, or give --kv-cache-memory SIZE")
    return budget
