"""`trtbuild build` of a tp/pp checkpoint: per rank, one graph (and TensorRT engine) per segment.

Engine dir (flat, so every graph's external data stays beside it, as onnxruntime and TensorRT require):
    config.json                     the manifest, with `mapping` (tp, pp)
    rank{r}.safetensors             rank r's shard (its own copy of the checkpoint's file)
    rank{r}.<segment>.onnx          the onnxruntime twin of each segment (parallel_mapping.Segment.file)
    rank{r}.<segment>.engine        with target tensorrt: the TensorRT engine of each segment
    tokenizer files

The twin graphs stay in portable ops (no pass rewrites them): they are what the CPU runtime executes and
the numerics reference. TensorRT gets the tensorrt pass list of the build config, per segment.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

import passes  # noqa: F401  (registers every pass)
from engine_builder.build.dtype_choice import choose_dtypes, resolved
from engine_builder.build.pipeline import BuildResult, manifest_of
from engine_builder.formats import graph_io as io
from engine_builder.formats import parallel_mapping as pm
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.checkpoint import CONFIG_FILE, CheckpointConfig, weights_file
from engine_builder.formats.manifest import ENGINE_SCHEMA, CheckpointSummary
from engine_builder.network.export import save_graph
from engine_builder.network.parallel_segments import build_segment
from engine_builder.util.atomic_dir import atomic_output_dir
from engine_builder.util.errors import InputError, TrtbuildError
from engine_builder.util.file_hash import sha256_file
from engine_builder.util.memory import PeakRss
from passes.base import PassManager

Stage = Callable[[str], None]


def sharded(ckpt: Path) -> bool:
    """Is CKPT a `convert --tp/--pp` checkpoint? (False for anything else: the normal build says what is wrong.)"""
    try:
        return CheckpointConfig.load(Path(ckpt)).mapping is not None
    except TrtbuildError:
        return False


def build_parallel(ckpt: Path, out: Path, config: BuildConfig = BuildConfig(), force: bool = False,
                   stage: Stage | None = None, ranks: tuple[int, ...] | None = None) -> BuildResult:
    """`trtbuild build` of tp/pp checkpoint dir CKPT into engine dir OUT. RANKS: build only these ranks'
    segments (tests; a dir built so cannot run)."""
    ckpt, out = Path(ckpt), Path(out)
    say = stage or (lambda _: None)
    checkpoint = CheckpointConfig.load(ckpt)
    mapping, cfg = checkpoint.mapping, checkpoint.model
    if mapping is None:
        raise InputError(f"{ckpt} is not a tp/pp checkpoint")
    config.validate()
    if config.kv_layout != "slots":  # each rank's KV cache is its own slot buffers (runner/parallel/rank_runner.py)
        raise InputError(f"--kv-layout {config.kv_layout} is not supported for a tp/pp checkpoint yet; drop it "
                         "(tp/pp engines use the slot layout)")
    lim = config.limits
    choice = choose_dtypes(config, checkpoint.dtype, checkpoint.quantization)  # as the single-process build
    dtype, twin = choice.engine, choice.twin
    config = dataclasses.replace(resolved(config, choice), logits_tail=1)
    targets = ("onnxruntime", *(t for t in config.targets if t != "onnxruntime"))
    started, peak = time.perf_counter(), PeakRss()
    reports: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    hashes: dict[str, str] = {}
    engine_bytes, trt_report = 0, None
    with atomic_output_dir(out, force, (ckpt,), ENGINE_SCHEMA) as tmp:
        for rank in ranks if ranks is not None else range(mapping.world_size):
            shutil.copyfile(ckpt / weights_file(rank), tmp / weights_file(rank))  # the engine's own copy
            for segment in mapping.segments(rank, cfg.num_layers):
                say(f"rank {rank}: {segment.name}")
                path = tmp / segment.file(rank)
                save_graph(build_segment(ckpt, rank, segment, lim.max_seq_len, twin), path)
                hashes[path.name] = sha256_file(path)
                if "tensorrt" in targets:
                    report = _build_trt_segment(ckpt, tmp, rank, segment, config)
                    engine_bytes += report["engine_bytes"]
                    trt_report = _add_segment_report(trt_report, segment.file(rank, "engine"), report)
        for f in ckpt.iterdir():
            if f.is_file() and f.name != CONFIG_FILE and not f.name.startswith("rank"):
                shutil.copyfile(f, tmp / f.name)
        result = BuildResult(out=str(out), targets=targets, dtype=dtype, passes=reports, graph_hashes=hashes,
                             engine_bytes=engine_bytes, seconds=round(time.perf_counter() - started, 3),
                             peak_rss_bytes=peak.above_baseline(),
                             tensorrt={**trt_report, "engine_bytes": engine_bytes} if trt_report else None,
                             twin_dtype=twin)
        manifest = manifest_of(config, result, tmp, model=cfg, mapping=mapping, dtype_choice=choice.reason,
                               checkpoint=CheckpointSummary(checkpoint.dtype, checkpoint.quantization,
                                                            checkpoint.source))
        manifest.save(tmp)
    return result


def _add_segment_report(total: dict[str, Any] | None, name: str, report: dict[str, Any]) -> dict[str, Any]:
    """The manifest's tensorrt block over every segment: the common keys a single build records (layer counts and
    build seconds summed), and each segment's engine bytes, build seconds and engine layers under `segments`."""
    total = total or {**{k: report[k] for k in ("flavour", "trt_version", "targets", "num_profiles")},
                      "build_seconds": 0.0, "network_layer_types": {}, "segments": {}}
    total["build_seconds"] = round(total["build_seconds"] + report["build_seconds"], 3)
    for kind, count in report["network_layer_types"].items():
        total["network_layer_types"][kind] = total["network_layer_types"].get(kind, 0) + count
    total["segments"][name] = {k: report[k] for k in ("engine_bytes", "build_seconds", "engine_layer_types")}
    return total


def segment_profiles(config: BuildConfig, inputs: list[ir.Value]) -> tuple[dict, ...]:
    """Decode (seq 1) and prefill (seq 2..max_input_len) profiles of one segment's inputs."""
    lim = config.limits
    longest = max(2, lim.max_input_len)
    seq_ranges = [(1, 1, 1), (2, min(longest, 128), longest)]
    profiles = []
    for lo, opt, hi in seq_ranges:
        profile: dict[str, tuple] = {}
        for value in inputs:
            dims = [int(d) if isinstance(d, int) else None for d in value.shape]
            if value.name.startswith(("past_key.", "past_value.")):
                rest = tuple(dims[1:])
                profile[value.name] = ((1, *rest), (1, *rest), (lim.max_batch, *rest))
            elif value.name == io.PAST_LENGTHS:
                profile[value.name] = ((1,), (1,), (lim.max_batch,))
            else:  # [batch, seq, ...]: input_ids, position_ids, hidden
                rest = tuple(dims[2:])
                profile[value.name] = ((1, lo, *rest), (1, opt, *rest), (lim.max_batch, hi, *rest))
        profiles.append(profile)
    return tuple(profiles)


def _build_trt_segment(ckpt: Path, tmp: Path, rank: int, segment: pm.Segment, config: BuildConfig) -> dict[str, Any]:
    """The TensorRT engine of one segment: its graph in the engine dtype, the tensorrt passes, a build."""
    from engine_builder.trt.engine_build import TrtBuildOptions, build_engine

    model = build_segment(ckpt, rank, segment, config.limits.max_seq_len, config.dtype)
    head_dim = CheckpointConfig.load(ckpt).model.head_dim
    PassManager(config.passes.tensorrt).run(model)
    graph = tmp / f".{segment.file(rank, 'trt.onnx')}"  # dropped after the build: the twin is the dir's graph
    save_graph(model, graph)
    options = TrtBuildOptions(compute_capabilities=config.compute_capabilities, opt_level=config.opt_level,
                              profiles=segment_profiles(config, list(model.graph.inputs)),
                              flavour=config.trt_flavour,  # type: ignore[arg-type]
                              # no fused kernel for fp32 or head_dim outside 32..256: build attention from plain ops
                              decomposable_attention=config.dtype == "float32" or not 32 <= head_dim <= 256)
    try:
        report = build_engine(graph, tmp / segment.file(rank, "engine"), options)
    finally:
        graph.unlink(missing_ok=True)
        for extra in tmp.glob(f"{graph.name}.data"):
            extra.unlink()
    return report.to_json()
