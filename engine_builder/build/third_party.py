"""`trtbuild build --onnx model.onnx OUT`: the same passes on a decoder graph exported elsewhere
(e.g. torch.onnx.export(..., dynamo=True) of a transformers model).

Such a graph keeps its own inputs and outputs, so the engine dir it makes is for inspection and
TensorRT deployment; `trtbuild run` needs a graph emitted from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import onnx_ir as ir

import passes  # noqa: F401  (registers every pass)
from engine_builder.build.pipeline import BuildResult, build_result, check_pass_lists, lower_for_targets, manifest_of
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.manifest import ENGINE_SCHEMA, SourceOnnx
from engine_builder.util.atomic_dir import atomic_output_dir, check_output_dir
from engine_builder.util.errors import InputError
from engine_builder.util.file_hash import sha256_file
from engine_builder.util.memory import PeakRss


def load_onnx(path: Path) -> ir.Model:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} does not exist; pass an .onnx file")
    try:
        return ir.load(path)  # external data resolves beside the file, read lazily
    except Exception as exc:  # protobuf and onnx_ir raise many types for a malformed file
        raise InputError(f"{path} is not a readable ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else 'parse failed'}); re-export it") from exc


def _profile(model: ir.Model, config: BuildConfig) -> dict[str, tuple]:
    """One profile: dynamic dim 0 is the batch, dynamic dim 1 the sequence."""
    lim = config.limits
    shapes: dict[str, tuple] = {}
    for value in model.graph.inputs:
        dims = list(value.shape or ())
        lo, opt, hi = [], [], []
        for i, d in enumerate(dims):
            if isinstance(d, int):
                lo.append(d), opt.append(d), hi.append(d)
            else:
                top = lim.max_batch if i == 0 else lim.max_input_len
                lo.append(1), opt.append(min(top, 1 if i == 0 else 64)), hi.append(top)
        shapes[value.name] = (tuple(lo), tuple(opt), tuple(hi))
    return shapes


def build_third_party(onnx_path: Path, out: Path, config: BuildConfig, force: bool = False,
                      explain: bool = False) -> BuildResult:
    config.validate()
    if config.dtype == "auto":  # the exporter's graph keeps its own dtypes; record the engine default
        config = dataclasses.replace(config, dtype="float16")
    out = Path(out)
    check_pass_lists(config)
    load_onnx(onnx_path)  # a malformed file fails before anything is created
    check_output_dir(out, force, (onnx_path,), ENGINE_SCHEMA)
    started, peak = time.perf_counter(), PeakRss()

    def trt_options(model: ir.Model) -> Any:
        from engine_builder.trt.engine_build import TrtBuildOptions

        # its dtype is the exporter's: allow fp32 attention as plain ops
        return TrtBuildOptions(config.compute_capabilities, config.opt_level, (_profile(model, config),),
                               decomposable_attention=True, flavour=config.trt_flavour)  # type: ignore[arg-type]

    with atomic_output_dir(out, force, (onnx_path,), ENGINE_SCHEMA) as tmp:
        lowered = lower_for_targets(
            tmp, config, make_model=lambda _target: load_onnx(onnx_path),
            # the weights go beside the graph: the passes may have made new ones (fused q/k/v)
            save=lambda model, path: ir.save(model, path, external_data=path.name + ".data"),
            trt_options=trt_options, explain=explain)
        result = build_result(out, config, lowered, started, peak)
        manifest_of(config, result, tmp,
                    source_onnx=SourceOnnx(Path(onnx_path).name, sha256_file(Path(onnx_path)))).save(tmp)
    return result
