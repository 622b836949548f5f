"""`--kv-cache-memory SIZE` and `--gpu-memory-utilization F` on run, chat and serve: what the KV block pool takes;
`--gpu-memory SIZE` on plan and inspect: the GPU the torch backend's memory plan is made for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from engine_builder.util.byte_size import parse_byte_size

KVCacheMemory = Annotated[str | None, typer.Option(
    "--kv-cache-memory", help="Bytes of the KV block pool of a paged engine (`build --kv-layout paged`), e.g. 2GiB "
                              "or 512MiB; it bounds how many tokens running and cached prompts hold. Default: a "
                              "quarter of the available RAM.")]


def kv_cache_bytes(text: str | None) -> int | None:
    return None if text is None else parse_byte_size(text, "--kv-cache-memory")


GpuMemoryUtilization = Annotated[float | None, typer.Option(
    "--gpu-memory-utilization", help="The torch backend on a CUDA GPU: the fraction of the GPU's memory this process "
                                     "may use (weights, activations, CUDA graphs and the KV pool, which gets the "
                                     "rest; vLLM's flag). Default 0.9; --kv-cache-memory sizes the pool instead.")]


GpuMemory = Annotated[str | None, typer.Option(
    "--gpu-memory", help="The GPU memory the torch backend's plan is made for (weights, activations and graphs, "
                         "the KV pool and how many tokens it holds), e.g. 141GiB. Default: this machine's GPU, else "
                         "80GiB (an H100).")]
DEFAULT_GPU_BYTES = 80 << 30


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a torch-backend memory plan is made for (formats/device_plan.py), and where its size came from."""

    device_bytes: int
    utilization: float
    reserve: int
    source: str


def gpu_target(gpu_memory: str | None, utilization: float | None) -> GpuTarget:
    """--gpu-memory, else this machine's GPU (asked of the driver, no torch import), else an 80 GiB one."""
    from engine_builder.formats.device_plan import check_utilization
    from engine_builder.runner.torch_backend.registered import cuda_total_memory
    from engine_builder.runner.tunables import ACTIVATION_RESERVE, DEFAULT_GPU_MEMORY_UTILIZATION

    if utilization is not None:
        check_utilization(utilization)
    if gpu_memory is not None:
        size, source = parse_byte_size(gpu_memory, "--gpu-memory"), "--gpu-memory"
    elif (here := cuda_total_memory()) is not None:
        size, source = here, "this machine's GPU"
    else:
        size, source = DEFAULT_GPU_BYTES, "no GPU here: an 80 GiB one; --gpu-memory sets it"
    return GpuTarget(size, DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization,
                     ACTIVATION_RESERVE, source)
