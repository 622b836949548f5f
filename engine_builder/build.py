"""`trtbuild build`: checkpoint -> engine dir with the TensorRT engine and its ONNX twin.

    engine-dir/
      config.json        manifest: versions, model, build config, pass report, hashes, cost
      model.onnx         the onnxruntime twin (always written): numerics and CPU runs
      model.trt.onnx     the graph TensorRT parsed (kept to rebuild or refit without re-running passes)
      rank0.engine       serialized TensorRT(-RTX) engine (target tensorrt)
      rank0.safetensors  hard link of the checkpoint's weights, which both graphs reference
      tokenizer files
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir

import passes  # noqa: F401  (registers every pass)
from engine_builder import __version__
from engine_builder.atomic_dir import atomic_output_dir, check_output_dir
from engine_builder.build_config import BuildConfig
from engine_builder.config import CheckpointConfig
from engine_builder.engine_files import ENGINE_FILE, ENGINE_SCHEMA, ENGINE_SCHEMA_VERSION, ORT_MODEL, TRT_MODEL
from engine_builder.memory import PeakRss
from engine_builder.network import NetworkOptions, build_decoder
from engine_builder.network import graph_io as io
from engine_builder.network.weights import WEIGHTS_FILE, link_weights
from engine_builder.target_check import check_target_ops
from passes.base import PassManager, PassResult

_NOT_TOKENIZER = {"config.json", WEIGHTS_FILE}

Stage = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    out: str
    targets: tuple[str, ...]
    dtype: str
    passes: dict[str, list[dict[str, Any]]]
    graph_hashes: dict[str, str]
    engine_bytes: int
    seconds: float
    peak_rss_bytes: int
    tensorrt: dict[str, Any] | None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def trt_profiles(config: BuildConfig, model_inputs: list[ir.Value]) -> tuple[dict, dict]:
    """Two optimization profiles: decode (seq 1, gemv attention) and prefill (seq 2..max_input_len)."""
    lim = config.limits
    decode: dict[str, tuple] = {}
    prefill: dict[str, tuple] = {}
    for value in model_inputs:
        rest = tuple(int(d) for d in value.shape[1:]) if value.name.startswith(("past_key.", "past_value.")) else None
        if rest is not None:  # [batch, kv_heads, max_seq, head_dim]
            shapes = ((1, *rest), (1, *rest), (lim.max_batch, *rest))
            decode[value.name] = prefill[value.name] = shapes
        elif value.name == io.PAST_LENGTHS:
            decode[value.name] = prefill[value.name] = ((1,), (1,), (lim.max_batch,))
        else:  # input_ids, position_ids: [batch, seq]
            decode[value.name] = ((1, 1), (1, 1), (lim.max_batch, 1))
            longest = max(2, lim.max_input_len)
            prefill[value.name] = ((1, 2), (1, min(longest, 128)), (lim.max_batch, longest))
    return decode, prefill


def _run_passes(model: ir.Model, names: tuple[str, ...], explain: bool) -> list[PassResult]:
    return PassManager(names).run(model, explain=explain)


def build(ckpt: Path, out: Path, config: BuildConfig = BuildConfig(), force: bool = False,
          explain: bool = False, stage: Stage | None = None, trt_progress: Callable | None = None) -> BuildResult:
    """Build engine dir OUT from checkpoint dir CKPT. `stage(text)` hears of each step."""
    config.validate()
    ckpt, out = Path(ckpt), Path(out)
    checkpoint = CheckpointConfig.load(ckpt)
    for target in config.targets:  # unknown pass names fail before any work
        PassManager(getattr(config.passes, target))
    check_output_dir(out, force)
    started, peak = time.perf_counter(), PeakRss()
    say = stage or (lambda _: None)
    network = NetworkOptions(max_seq_len=config.limits.max_seq_len, dtype=config.dtype)
    reports: dict[str, list[PassResult]] = {}
    hashes: dict[str, str] = {}
    trt_report = None
    with atomic_output_dir(out, force) as tmp:
        link_weights(ckpt, tmp)
        targets = ("onnxruntime", *(t for t in config.targets if t != "onnxruntime"))  # the twin always
        for target in targets:
            say(f"graph and passes for {target}")
            model = build_decoder(ckpt, network)
            reports[target] = _run_passes(model, getattr(config.passes, target), explain)
            check_target_ops(model, target)
            path = tmp / (ORT_MODEL if target == "onnxruntime" else TRT_MODEL)
            ir.save(model, path)  # weights stay external: rank0.safetensors at their offsets
            hashes[target] = _sha256(path)
            if target == "tensorrt":
                say("TensorRT engine")
                trt_report = _build_trt(path, tmp / ENGINE_FILE, config, list(model.graph.inputs), trt_progress)
        for f in ckpt.iterdir():
            if f.is_file() and f.name not in _NOT_TOKENIZER:
                shutil.copyfile(f, tmp / f.name)
        seconds = time.perf_counter() - started
        result = BuildResult(
            out=str(out), targets=tuple(targets), dtype=config.dtype,
            passes={t: [dataclasses.asdict(r) for r in rs] for t, rs in reports.items()},
            graph_hashes=hashes, engine_bytes=trt_report["engine_bytes"] if trt_report else 0,
            seconds=round(seconds, 3), peak_rss_bytes=peak.above_baseline(), tensorrt=trt_report)
        (tmp / "config.json").write_text(json.dumps(_manifest(checkpoint, config, result), indent=2) + "\n")
    return result


def _build_trt(onnx_path: Path, engine_path: Path, config: BuildConfig, inputs: list[ir.Value],
               progress: Callable | None) -> dict[str, Any]:
    from engine_builder.trt_build import TrtBuildOptions, build_engine

    options = TrtBuildOptions(
        compute_capabilities=config.compute_capabilities, opt_level=config.opt_level,
        profiles=trt_profiles(config, inputs), flavour=config.trt_flavour,  # type: ignore[arg-type]
        refittable=config.weights == "refittable", strip_weights=config.weights == "stripped",
        # TensorRT-RTX has no fp32 attention kernel: let it build fp32 attention from plain ops
        decomposable_attention=config.dtype == "float32")
    report = build_engine(onnx_path, engine_path, options, progress)
    return {**report.to_json(), "profiles": [{k: [list(s) for s in v] for k, v in p.items()}
                                             for p in options.profiles]}


def _manifest(checkpoint: CheckpointConfig, config: BuildConfig, result: BuildResult) -> dict[str, Any]:
    import onnxruntime

    return {
        "schema": ENGINE_SCHEMA, "schema_version": ENGINE_SCHEMA_VERSION,
        "versions": {"trtbuild": __version__, "onnxruntime": onnxruntime.__version__,
                     "tensorrt": {k: result.tensorrt[k] for k in ("flavour", "trt_version")}
                     if result.tensorrt else None},
        "model": dataclasses.asdict(checkpoint.model),
        "checkpoint": {"dtype": checkpoint.dtype, "quantization": dataclasses.asdict(checkpoint.quantization),
                       "source": dataclasses.asdict(checkpoint.source)},
        "build": dataclasses.asdict(config),
        "targets": list(result.targets),
        "passes": result.passes,
        "graph_hashes": result.graph_hashes,
        "tensorrt": result.tensorrt,
        "cost": {"build_seconds": result.seconds, "peak_rss_bytes": result.peak_rss_bytes},
    }
