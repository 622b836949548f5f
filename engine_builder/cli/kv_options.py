"""`--kv-cache-memory SIZE` and `--gpu-memory-utilization F` on run, chat and serve: what the KV block pool takes."""

from __future__ import annotations

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
