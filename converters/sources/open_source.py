"""Which reader a convert source needs: a .gguf file or an HF safetensors dir."""

from __future__ import annotations

from pathlib import Path

from converters.sources.hf_safetensors import HFSafetensorsSource
from converters.sources.source import Source
from engine_builder.util.errors import InputError


def open_source(src: Path) -> Source:
    src = Path(src)
    if not src.exists():
        raise InputError(f"{src} does not exist; pass an HF model dir or a .gguf file")
    if src.is_file():
        if src.suffix == ".gguf":
            from converters.sources.gguf import GGUFSource

            return GGUFSource(src)
        raise InputError(f"{src} is a file but not a .gguf; pass an HF model dir or a .gguf file")
    return HFSafetensorsSource(src)
