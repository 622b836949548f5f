"""Reading an engine dir back: its manifest, file sizes, and whether it can run here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_builder.engine_files import ENGINE_FILE, ENGINE_SCHEMA, ENGINE_SCHEMA_VERSION, ORT_MODEL
from engine_builder.errors import InputError


def load_manifest(engine_dir: Path) -> dict[str, Any]:
    engine_dir = Path(engine_dir)
    path = engine_dir / "config.json"
    if not engine_dir.is_dir():
        raise InputError(f"{engine_dir} is not a directory; pass an engine dir written by `trtbuild build`")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{engine_dir} has no config.json; pass an engine dir written by `trtbuild build`") from None
    except ValueError as exc:
        raise InputError(f"{path} is corrupt ({exc}); rebuild with `trtbuild build`") from exc
    if not isinstance(manifest, dict) or manifest.get("schema") != ENGINE_SCHEMA:
        raise InputError(f"{engine_dir} is not a trtbuild engine dir (config.json has no "
                         f"'{ENGINE_SCHEMA}' schema); a checkpoint dir goes to `trtbuild build` first")
    if manifest.get("schema_version") != ENGINE_SCHEMA_VERSION:
        raise InputError(f"{engine_dir} has engine schema {manifest.get('schema_version')}, this trtbuild reads "
                         f"{ENGINE_SCHEMA_VERSION}; rebuild it with this version")
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
