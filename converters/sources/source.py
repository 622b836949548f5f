"""What every source reader offers (HF safetensors dir, GGUF file, pre-quantized AWQ/GPTQ dir).

A Source exposes HF-named tensors lazily, so the converter can stream them one at a time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

from converters.registry import TensorInfo
from engine_builder.util.errors import InputError

# Tokenizer-side files copied verbatim from an HF dir when present.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


class Source(Protocol):
    kind: str  # "hf-safetensors" | "gguf"
    hf_config: dict[str, Any]

    def tensor_infos(self) -> dict[str, TensorInfo]: ...

    def load(self, name: str) -> torch.Tensor: ...

    def raw_range(self, name: str) -> tuple[Path, int, int] | None:
        """(file, byte offset, byte count) of tensor `name` stored as-is, when it is."""
        ...

    def files(self) -> list[Path]: ...

    def write_tokenizer(self, out_dir: Path) -> list[str]: ...


def safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Parse and sanity-check a safetensors header without touching the tensor data."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError("header longer than file")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        for k, v in header.items():
            if k != "__metadata__" and (v["dtype"] not in _ST_TO_TORCH or not isinstance(v["shape"], list)):
                raise ValueError(f"tensor {k!r} has unknown dtype {v['dtype']!r}")
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not a valid safetensors file ({exc}); re-download or re-save it") from exc
    if 8 + n + end != size:
        raise InputError(
            f"{path} is truncated or corrupt: header describes {8 + n + end} bytes, file has {size}; "
            f"re-download or re-save it")
    return n, header


_ST_TO_TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _torch_dtype_name(st_dtype: str) -> str:
    return _ST_TO_TORCH[st_dtype]
