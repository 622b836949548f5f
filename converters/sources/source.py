"""What every source reader offers (HF safetensors dir, GGUF file, pre-quantized AWQ/GPTQ dir).

A Source exposes HF-named tensors lazily, so the converter can stream them one at a time.
"""

from __future__ import annotations

import json
import math
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


# The safetensors library's own bound on a header (its MAX_HEADER_SIZE); json.loads of 100 MB takes ~3 GB
MAX_HEADER_BYTES = 100_000_000


def safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    """Parse and sanity-check a safetensors header without touching the tensor data.

    As the format (and the safetensors library) requires, the tensors' byte ranges tile the data area
    exactly: each begins where the previous ends, holds its shape's bytes, none reversed or overlapping.
    A range that did not would be copied as it is by convert's kernel file-to-file copy."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError("header longer than file")
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"header of {n} bytes, over the format's {MAX_HEADER_BYTES}")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        tensors = sorted((_byte_range(k, v), k) for k, v in header.items() if k != "__metadata__")
    except (struct.error, ValueError, KeyError, TypeError, RecursionError) as exc:  # UnicodeDecodeError: ValueError
        reason = "header nested too deeply" if isinstance(exc, RecursionError) else exc
        raise InputError(f"{path} is not a valid safetensors file ({reason}); re-download or re-save it") from None
    end = 0
    for (start, stop), name in tensors:
        if start != end:
            what = "overlaps the tensor before it" if start < end else f"leaves {start - end} bytes unused before it"
            raise InputError(f"{path} is corrupt: tensor {name!r} (bytes {start}..{stop} of the data) {what}; "
                             f"re-download or re-save it")
        end = stop
    if 8 + n + end != size:
        raise InputError(
            f"{path} is truncated or corrupt: header describes {8 + n + end} bytes, file has {size}; "
            f"re-download or re-save it")
    return n, header


def _byte_range(name: str, meta: Any) -> tuple[int, int]:
    """(start, end) in the data area of tensor NAME, checked against its dtype and shape; ValueError if wrong."""
    if not isinstance(meta, dict) or meta.get("dtype") not in _ST_TO_TORCH:
        raise ValueError(f"tensor {name!r} has unknown dtype {meta.get('dtype') if isinstance(meta, dict) else meta!r}")
    shape, offsets = meta.get("shape"), meta.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {name!r} has data_offsets {offsets!r}, not [start, end] with 0 <= start <= end")
    nbytes = math.prod(shape) * _ST_ITEMSIZE[meta["dtype"]]
    if offsets[1] - offsets[0] != nbytes:
        raise ValueError(f"tensor {name!r} spans {offsets[1] - offsets[0]} bytes, but its {meta['dtype']} shape "
                         f"{shape} needs {nbytes}")
    return offsets[0], offsets[1]


_ST_TO_TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}

_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _torch_dtype_name(st_dtype: str) -> str:
    return _ST_TO_TORCH[st_dtype]
