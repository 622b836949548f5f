"""`trtbuild inspect`: what an engine dir holds and whether it can run here, decided without loading it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from engine_builder.cli.console import print_json, stdout
from engine_builder.cli.kv_options import GpuMemory, GpuMemoryUtilization, gpu_target
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.moe_layout import describe_moe


def inspect(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    gpu_memory: GpuMemory = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Show what an engine dir holds and whether it can run on this machine (decided without loading it), and
    the torch backend's GPU memory for it (weights, activations, the KV pool and the tokens it holds)."""
    from engine_builder.runner.engine_summary import (
        describe_quantization,
        describe_vision,
        quantization_of,
        summarize,
    )

    summary = summarize(engine_dir)
    m = summary.manifest
    # sizes only (stat, no reads): hashing is `trtbuild verify`'s job, and every load's
    changed = [d.name for d in m.files if summary.files.get(d.name) != d.size]
    integrity = {"recorded": {d.name: d.sha256 for d in m.files}, "size_changed": changed,
                 "check": f"trtbuild verify {engine_dir}"}
    from engine_builder.runner.torch_backend.registered import torch_verdict

    torch_ok, torch_why = torch_verdict(m, Path(engine_dir), asked=False)
    gpu = _torch_gpu(m, gpu_memory, gpu_memory_utilization)
    if as_json:
        from engine_builder.cli.json_summary import pass_counts, tensorrt_summary

        data = m.to_dict()
        model = {k: data["model"][k] for k in ("architecture", "num_layers", "hidden_size", "num_heads",
                                               "num_kv_heads", "vocab_size")} if data["model"] else None
        print_json({"path": summary.path, "model": model, "dtype": m.build.dtype,
                    "twin_dtype": m.twin_dtype, "dtype_choice": m.dtype_choice, "precision": _precision(m),
                    "limits": data["build"]["limits"], "targets": m.targets, "versions": data["versions"],
                    "passes": pass_counts(m.passes), "tensorrt": tensorrt_summary(m.tensorrt),
                    "files": summary.files,
                    "graph_hashes": m.graph_hashes, "quantization": quantization_of(m),
                    "vision": describe_vision(m.model) if m.model is not None else None,
                    "vision_engine": data["vision_engine"],
                    "integrity": integrity, "torch_gpu": gpu,
                    "verdict": {"tensorrt": {"ok": summary.tensorrt_ok, "reason": summary.tensorrt_verdict},
                                "torch": {"ok": torch_ok, "reason": torch_why},
                                "onnxruntime": {"ok": summary.onnxruntime_ok}},
                    "details": str(Path(engine_dir) / "config.json")}, one_line_values=True)
        return
    table = Table(show_header=False, title=f"engine dir {summary.path}")
    if (model := m.model) is not None:
        table.add_row("model", f"{model.architecture}: {model.num_layers} layers, hidden {model.hidden_size}, "
                               f"{model.num_heads}/{model.num_kv_heads} heads, vocab {model.vocab_size}")
        if (enc := model.encoder) is not None:  # what `run --embed` and /v1/embeddings return
            normalized = ", L2-normalized" if enc.pooling.normalize else ""
            table.add_row("embeddings",
                          f"encoder, {enc.pooling.mode} pooling{normalized}, {model.hidden_size} dimensions")
        if (experts := describe_moe(model)) is not None:
            table.add_row("experts", experts)
        if (vision := describe_vision(model)) is not None:
            table.add_row("vision", vision)
        if m.vision_engine is not None:  # built beside the decoder's engine for target tensorrt
            table.add_row("vision engine", m.vision_engine.describe())
    elif m.source_onnx is not None:
        table.add_row("model", f"exported ONNX graph {m.source_onnx.name}")
    checkpoint = f" (checkpoint {m.checkpoint.dtype})" if m.checkpoint else ""
    table.add_row("precision", f"engine {m.build.dtype}, onnxruntime twin {m.twin_dtype}{checkpoint}")
    if m.dtype_choice:
        table.add_row("why", m.dtype_choice)
    limits = dataclasses.asdict(m.build.limits)
    if m.model is None or m.model.vision is None:
        limits.pop("max_images")  # a text model's build has no vision engine for it to size
    table.add_row("limits", ", ".join(f"{k} {v}" for k, v in limits.items()))
    table.add_row("targets", ", ".join(m.targets))
    if (q := quantization_of(m)) is not None:
        table.add_row("quantization", describe_quantization(q))
    if (groups := _precision(m)) is not None:
        table.add_row("tensor groups", "; ".join(f"{k} {v}" for k, v in groups.items()))
    trt = m.tensorrt
    if trt:
        table.add_row("tensorrt", f"{trt['flavour']} {trt['trt_version']}, targets {','.join(trt['targets'])}, "
                                  f"{trt['num_profiles']} profiles, built in {trt['build_seconds']}s")
        table.add_row("layers", ", ".join(f"{k} {v}" for k, v in sorted(trt["network_layer_types"].items())))
    for target_name, results in m.passes.items():
        table.add_row(f"passes ({target_name})", ", ".join(f"{r['name']} {r['matches']}" for r in results))
    table.add_row("files", ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in summary.files.items()))
    sizes = f"SIZE CHANGED: {', '.join(changed)}" if changed else "sizes match"
    table.add_row("integrity", f"sha256 of {len(m.files)} files recorded, {sizes}; run `trtbuild verify "
                               f"{engine_dir}` to check the hashes (loads check them too)")
    table.add_row("tensorrt here", summary.tensorrt_verdict if m.mapping is None else
                  "tp/pp engines run their segments' onnxruntime twins; the TensorRT segment engines are built, "
                  "not yet run")
    table.add_row("torch here", torch_why)
    if gpu is not None:
        table.add_row("torch GPU memory", f"{gpu['line']} ({gpu['source']})")
    if m.mapping is not None:  # tp/pp: a graph per rank and segment, run by one process per rank
        table.add_row("onnxruntime here", f"ok: tp={m.mapping.tp} x pp={m.mapping.pp} ranks, their segments on CPU "
                      f"(`trtbuild run {engine_dir}` spawns them, or torchrun --nproc-per-node {m.mapping.world_size})")
    else:
        table.add_row("onnxruntime here", "ok: model.onnx runs on CPU" if summary.onnxruntime_ok else "no model.onnx")
    stdout.print(table)


def _torch_gpu(m: EngineManifest, gpu_memory: str | None, utilization: float | None) -> dict | None:
    """The torch backend's memory plan for this engine dir on the given or this machine's GPU (one-GPU decoders)."""
    if m.model is None or m.model.encoder is not None or m.mapping is not None:
        return None
    from engine_builder.formats.device_plan import plan_device

    gpu = gpu_target(gpu_memory, utilization)
    lim = m.build.limits
    plan = plan_device(m.model, lim, m.build.dtype, gpu.device_bytes, utilization=gpu.utilization,
                       reserve=gpu.reserve, block_size=m.build.kv_block_size or 16)
    return plan.shown(gpu.source)


def _precision(m: EngineManifest) -> dict[str, str] | None:
    """Embeddings / body / lm_head precision as the checkpoint stored them (None for `build --onnx` dirs)."""
    if m.model is None or m.checkpoint is None:
        return None
    from engine_builder.formats.precision import tensor_groups

    return tensor_groups(m.model, m.checkpoint.dtype, m.checkpoint.quantization)
