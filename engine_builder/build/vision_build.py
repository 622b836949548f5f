"""A vision-language build's second graph: the vision tower + projector (network/vision_encoder.py) beside the decoder.

Always `vision.onnx`, in the twin's dtype, for onnxruntime (what the runtime encodes images with); with target
tensorrt also `vision.trt.onnx` in the engine's dtype and `vision.engine` built from it, one optimization profile
over images per call (formats/vision_engine.py). No pass list runs on either: the lists hold decoder rewrites, and
onnxruntime and TensorRT each fuse the plain MatMul -> Softmax -> MatMul attention themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_builder.build.target_check import check_target_ops
from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.vision_engine import VisionEngine
from engine_builder.formats.vision_spec import PIXEL_VALUES, VISION_ENGINE, VISION_MODEL, VISION_TRT_MODEL, VisionSpec
from engine_builder.network import NetworkOptions, save_graph
from engine_builder.network.vision_encoder import build_vision_encoder
from engine_builder.util.file_hash import sha256_file

# graph_hashes keys beside the decoder's targets
VISION_HASH, VISION_TRT_HASH = "vision", "vision.tensorrt"


def vision_profile(config: BuildConfig, spec: VisionSpec) -> dict[str, tuple[tuple[int, ...], ...]]:
    """pixel_values [images, channels, size, size]: images 1 (opt 1: a request most often brings one image) to
    limits.max_images, and at least the tiles one image becomes (Idefics3: up to 17 for SmolVLM, which a call must
    take whole); the rest is the tower's fixed input."""
    rest = (spec.num_channels, spec.image_size, spec.image_size)
    most = max(config.limits.max_images, spec.max_graph_images())
    return {PIXEL_VALUES: tuple((n, *rest) for n in (1, 1, most))}


def write_vision_graphs(ckpt: Path, out_dir: Path, config: BuildConfig, networks: dict[str, NetworkOptions],
                        spec: VisionSpec, trt_options: Callable[[dict], Any], say: Callable[[str], None],
                        trt_progress: Callable | None = None) -> tuple[dict[str, str], VisionEngine | None]:
    """vision.onnx, and for target tensorrt vision.trt.onnx + vision.engine, into OUT_DIR: the graphs' sha256 (keys
    VISION_HASH, VISION_TRT_HASH, beside the decoder targets' in graph_hashes) and the engine's figures.
    TRT_OPTIONS(profile) gives the build options: the decoder's (capabilities, optimization level, weights), with
    this graph's one profile."""
    say("vision graph")
    save_graph(build_vision_encoder(ckpt, networks["onnxruntime"]), out_dir / VISION_MODEL)
    hashes = {VISION_HASH: sha256_file(out_dir / VISION_MODEL)}
    if "tensorrt" not in config.targets:
        return hashes, None
    from engine_builder.trt.engine_build import build_engine

    model = build_vision_encoder(ckpt, networks["tensorrt"])
    check_target_ops(model, "tensorrt")
    path = out_dir / VISION_TRT_MODEL
    save_graph(model, path)
    hashes[VISION_TRT_HASH] = sha256_file(path)
    say("TensorRT vision engine")
    profile = vision_profile(config, spec)
    report = build_engine(path, out_dir / VISION_ENGINE, trt_options(profile), trt_progress)
    lo, opt, hi = (shape[0] for shape in profile[PIXEL_VALUES])
    engine = VisionEngine(dtype=networks["tensorrt"].dtype, images=(lo, opt, hi),
                          engine_bytes=report.engine_bytes, build_seconds=round(report.build_seconds, 3),
                          network_layer_types=report.network_layer_types)
    return hashes, engine
