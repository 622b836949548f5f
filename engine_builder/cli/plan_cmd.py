"""`trtbuild plan SRC`: what convert and build will need and make, before any work (build/resource_plan.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from engine_builder.cli.console import print_json, stdout
from engine_builder.cli.kv_options import GpuMemory, GpuMemoryUtilization, gpu_target


def plan(
    src: Annotated[Path, typer.Argument(help="HF model dir, .gguf file, or a checkpoint dir from `trtbuild convert`.")],
    quant: Annotated[str, typer.Option(metavar="SCHEME", help="As `trtbuild convert --quant`.")] = "none",
    group_size: Annotated[int | None, typer.Option(help="As `trtbuild convert --group-size`.")] = None,
    lm_head: Annotated[str | None, typer.Option("--lm-head", help="As `trtbuild convert --lm-head`.")] = None,
    kv_cache: Annotated[str, typer.Option(help="As `trtbuild convert --kv-cache`.")] = "none",
    dtype: Annotated[str, typer.Option(help="Checkpoint dtype, as `trtbuild convert --dtype`.")] = "auto",
    target: Annotated[str, typer.Option(help="tensorrt, onnxruntime or all, as `trtbuild build`.")] = "all",
    build_dtype: Annotated[str | None, typer.Option(help="As `trtbuild build --dtype` (default auto).")] = None,
    cc: Annotated[str | None, typer.Option(help="As `trtbuild build --cc`.")] = None,
    max_batch: Annotated[int | None, typer.Option(help="As `trtbuild build`.")] = None,
    max_input_len: Annotated[int | None, typer.Option(help="As `trtbuild build`.")] = None,
    max_seq_len: Annotated[int | None, typer.Option(help="As `trtbuild build`.")] = None,
    gpu_memory: GpuMemory = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable plan.")] = False,
) -> None:
    """Predict what converting and building SRC takes, before any work: peak RAM of convert and build, the
    checkpoint's and engine dir's sizes, KV cache bytes per token and for the limits, which targets and
    compute capabilities can run it, and the torch backend's GPU memory (weights, activations, the KV pool and
    the tokens it holds).

    Example: trtbuild plan model.gguf --quant int4_awq --group-size 64 --max-seq-len 4096
    """
    from engine_builder.build.preflight import check_compute_capabilities
    from engine_builder.build.resource_plan import describe, plan_resources
    from engine_builder.formats.build_config import BuildConfig, apply_overrides

    flags: dict[str, Any] = {"dtype": build_dtype, "limits.max_batch": max_batch, "limits.max_input_len": max_input_len,
                             "limits.max_seq_len": max_seq_len, "compute_capabilities": cc.split(",") if cc else None,
                             "targets": ["tensorrt", "onnxruntime"] if target == "all" else [target]}
    config = apply_overrides(BuildConfig(), {k: v for k, v in flags.items() if v is not None})
    config.validate()
    check_compute_capabilities(config)
    gpu = gpu_target(gpu_memory, gpu_memory_utilization)
    result = plan_resources(src, config, quant=quant, group_size=group_size, lm_head=lm_head, kv_cache=kv_cache,
                            dtype=dtype, gpu=(gpu.device_bytes, gpu.utilization, gpu.reserve, gpu.source))
    if as_json:
        print_json({**dataclasses.asdict(result), "fits_here": result.fits_here}, one_line_values=True)
        return
    for line in describe(result):
        stdout.print(line, markup=False, highlight=False)
