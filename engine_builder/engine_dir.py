"""Reading an engine dir back: its manifest, file sizes, and whether it can run here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.engine_files import ENGINE_FILE, ENGINE_SCHEMA, ENGINE_SCHEMA_VERSION, ORT_MODEL
from engine_builder.errors import InputError


def load_manifest(engine_dir: Path) -> dict[str, Any]:
    """The manifest of ENGINE_DIR, or an InputError naming the fix; nothing else is read."""
    path = Path(engine_dir)
    rebuild = f"build one with `trtbuild build <ckpt-dir> {path}`"
    if not path.exists():
        raise InputError(f"engine dir {path} does not exist; {rebuild}")
    manifest_path = path / "config.json"
    if not path.is_dir() or not manifest_path.is_file():
        raise InputError(f"{path} is not an engine dir (no config.json); {rebuild}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{manifest_path} is not valid JSON ({exc}); rebuild the engine dir") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != ENGINE_SCHEMA:
        raise InputError(f"{path} is not a trtbuild engine dir (config.json schema is not {ENGINE_SCHEMA!r}; "
                         f"a checkpoint dir?); {rebuild}")
    if manifest.get("schema_version") != ENGINE_SCHEMA_VERSION:
        raise InputError(f"{path} has engine schema {manifest.get('schema_version')}, this trtbuild reads "
                         f"{ENGINE_SCHEMA_VERSION}; rebuild it with this version of trtbuild")
    return manifest


@dataclass(frozen=True)
class EngineSummary:
    path: str
    manifest: dict[str, Any]
    files: dict[str, int]  # name -> bytes
    tensorrt_ok: bool
    tensorrt_verdict: str
    onnxruntime_ok: bool


def summarize(engine_dir: Path) -> EngineSummary:
    """Everything `trtbuild inspect` shows; decides compatibility before any load is attempted."""
    from engine_builder.trt_inspect import compatibility_verdict

    engine_dir = Path(engine_dir)
    manifest = load_manifest(engine_dir)
    files = {f.name: f.stat().st_size for f in sorted(engine_dir.iterdir()) if f.is_file()}
    if manifest.get("tensorrt"):
        ok, verdict = compatibility_verdict(manifest["tensorrt"], engine_path=engine_dir / ENGINE_FILE)
    else:
        ok, verdict = False, "no TensorRT engine in this dir (built for onnxruntime only)"
    return EngineSummary(str(engine_dir), manifest, files, ok, verdict, ORT_MODEL in files)


def quantization_of(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's quantization block plus how the onnxruntime twin runs it; None when nothing is quantized."""
    block = (manifest.get("checkpoint") or {}).get("quantization") or {}
    if block.get("scheme", "none") == "none" and block.get("kv_cache", "none") == "none":
        return None
    level = (manifest.get("quantization") or {}).get("onnxruntime_accuracy_level")
    return {**block, "onnxruntime_accuracy_level": level}


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
