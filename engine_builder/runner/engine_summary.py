"""What `trtbuild inspect` shows of an engine dir: its manifest, file sizes, and whether it can run here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.formats.manifest import ENGINE_FILE, ORT_MODEL, EngineManifest
from engine_builder.formats.model_config import ModelConfig


@dataclass(frozen=True)
class EngineSummary:
    path: str
    manifest: EngineManifest
    files: dict[str, int]  # name -> bytes
    tensorrt_ok: bool
    tensorrt_verdict: str
    onnxruntime_ok: bool


def summarize(engine_dir: Path) -> EngineSummary:
    """Everything `trtbuild inspect` shows; decides compatibility before any load is attempted."""
    from engine_builder.trt.compatibility import compatibility_verdict

    engine_dir = Path(engine_dir)
    manifest = EngineManifest.load(engine_dir)
    files = {f.name: f.stat().st_size for f in sorted(engine_dir.iterdir()) if f.is_file()}
    if manifest.tensorrt:
        ok, verdict = compatibility_verdict(manifest.tensorrt, engine_path=engine_dir / ENGINE_FILE)
    else:
        ok, verdict = False, "no TensorRT engine in this dir (built for onnxruntime only)"
    return EngineSummary(str(engine_dir), manifest, files, ok, verdict, ORT_MODEL in files)


def quantization_of(manifest: EngineManifest) -> dict[str, Any] | None:
    """The checkpoint's quantization block plus how the onnxruntime twin runs it; None when nothing is quantized."""
    q = manifest.checkpoint_quantization
    if q.scheme == "none" and q.kv_cache == "none":
        return None
    level = manifest.quantization.onnxruntime_accuracy_level if manifest.quantization else None
    return {**dataclasses.asdict(q), "onnxruntime_accuracy_level": level}


def describe_quantization(q: dict[str, Any]) -> str:
    """quantization_of's block in one line, for `trtbuild inspect`."""
    parts = []
    if q["scheme"] != "none":
        group = f" group {q['group_size']}" if q.get("group_size") else ""
        parts.append(f"{q['scheme']}{group}: {len(q['quantized'])} linears, {len(q['excluded'])} kept float")
    if q.get("kv_cache", "none") != "none":
        parts.append(f"KV cache {q['kv_cache']}")
    if q.get("calibration"):
        c = q["calibration"]
        parts.append(f"calibrated on {c['source']} ({c['samples']} x {c['seq_len']} tokens)")
    if q["onnxruntime_accuracy_level"] is not None:
        parts.append(f"onnxruntime MatMulNBits accuracy level {q['onnxruntime_accuracy_level']}")
    return "; ".join(parts)


def describe_vision(model: ModelConfig) -> str | None:
    """A vision-language model's tower and image layout in one line (vision.onnx beside the decoder), for inspect."""
    v = model.vision
    if v is None:
        return None
    p = v.processor
    size = p.output_size() or (p.shortest_edge, p.shortest_edge)
    if p.tiling is None:
        unit, tiles = "image", ""
    else:  # Idefics3: an image is its tiles and the global image, each one image for the tower
        unit, tiles = "tile", (f"; images resized to {p.tiling.longest_edge} px on the longer side and cut into "
                               f"tiles" if p.tiling.split else "; images squashed to one tile")
    return (f"{v.tower} tower ({v.num_layers} layers, hidden {v.hidden_size}, {v.image_size} px, patch {v.patch_size})"
            f" in vision.onnx; {v.tokens_per_image} tokens per {unit} at token id {v.image_token_id}; {unit}s "
            f"{size[0]}x{size[1]}, {p.resample}, mean {list(p.image_mean)}{tiles}")
