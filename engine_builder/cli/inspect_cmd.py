"""`trtbuild inspect`: what an engine dir holds and whether it can run here, decided without loading it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from engine_builder.cli.console import print_json, stdout
from engine_builder.formats.moe_layout import describe_moe


def inspect(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Show what an engine dir holds and whether it can run on this machine (decided without loading it)."""
    from engine_builder.runner.engine_summary import describe_quantization, quantization_of, summarize

    summary = summarize(engine_dir)
    m = summary.manifest
    # sizes only (stat, no reads): hashing is `trtbuild verify`'s job, and every load's
    changed = [d.name for d in m.files if summary.files.get(d.name) != d.size]
    integrity = {"recorded": {d.name: d.sha256 for d in m.files}, "size_changed": changed,
                 "check": f"trtbuild verify {engine_dir}"}
    if as_json:
        data = m.to_dict()
        print_json({"path": summary.path, "model": data["model"], "dtype": m.build.dtype,
                    "limits": data["build"]["limits"], "targets": m.targets, "versions": data["versions"],
                    "passes": m.passes, "tensorrt": m.tensorrt, "files": summary.files,
                    "graph_hashes": m.graph_hashes, "quantization": quantization_of(m),
                    "integrity": integrity,
                    "verdict": {"tensorrt": {"ok": summary.tensorrt_ok, "reason": summary.tensorrt_verdict},
                                "onnxruntime": {"ok": summary.onnxruntime_ok}}})
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
    elif m.source_onnx is not None:
        table.add_row("model", f"exported ONNX graph {m.source_onnx.name}")
    checkpoint = f" (checkpoint {m.checkpoint.dtype})" if m.checkpoint else ""
    table.add_row("precision", f"{m.build.dtype}{checkpoint}")
    table.add_row("limits", ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(m.build.limits).items()))
    table.add_row("targets", ", ".join(m.targets))
    if (q := quantization_of(m)) is not None:
        table.add_row("quantization", describe_quantization(q))
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
    table.add_row("tensorrt here", summary.tensorrt_verdict)
    table.add_row("onnxruntime here", "ok: model.onnx runs on CPU" if summary.onnxruntime_ok else "no model.onnx")
    stdout.print(table)
