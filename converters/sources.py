"""Readers for what `trtbuild convert` accepts: an HF safetensors dir or a GGUF file.

A Source exposes HF-named tensors lazily, so the converter can stream them one at a time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

from converters.base import TensorInfo
from engine_builder.errors import InputError

# Tokenizer-side files copied verbatim from an HF dir when present.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
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


def open_source(src: Path) -> Source:
    src = Path(src)
    if not src.exists():
        raise InputError(f"{src} does not exist; pass an HF model dir or a .gguf file")
    if src.is_file():
        if src.suffix == ".gguf":
            from converters.gguf_source import GGUFSource

            return GGUFSource(src)
        raise InputError(f"{src} is a file but not a .gguf; pass an HF model dir or a .gguf file")
    return HFSafetensorsSource(src)


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


class HFSafetensorsSource:
    kind = "hf-safetensors"

    def __init__(self, root: Path):
        self.root = root
        config_path = root / "config.json"
        if not config_path.is_file():
            raise InputError(f"{root} has no config.json; pass the dir that holds config.json and *.safetensors")
        try:
            self.hf_config = json.loads(config_path.read_text())
        except ValueError as exc:
            raise InputError(f"{config_path} is not valid JSON ({exc})") from exc
        self._shards = self._find_shards()
        # name -> (shard, absolute byte offset, byte count); headers only, no tensor data read
        self._ranges: dict[str, tuple[Path, int, int]] = {}
        self._infos: dict[str, TensorInfo] = {}
        for shard in self._shards:
            header_len, header = safetensors_header(shard)
            for name, meta in header.items():
                if name == "__metadata__":
                    continue
                start, end = meta["data_offsets"]
                self._ranges[name] = (shard, 8 + header_len + start, end - start)
                self._infos[name] = TensorInfo(tuple(meta["shape"]), _torch_dtype_name(meta["dtype"]))

    def _find_shards(self) -> list[Path]:
        index = self.root / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as exc:
                raise InputError(f"{index} is not a valid safetensors index ({exc})") from exc
            shards = sorted({self.root / f for f in weight_map.values()})
            if missing := [s.name for s in shards if not s.is_file()]:
                raise InputError(f"{index} names missing shard(s) {', '.join(missing)}; re-download them")
            return shards
        shards = sorted(self.root.glob("*.safetensors"))
        if shards:
            return shards
        pickles = sorted(p.name for p in self.root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise InputError(
                f"{self.root} holds only pickle checkpoints ({', '.join(pickles[:2])}), which trtbuild "
                f"never unpickles; re-save as safetensors: "
                f"AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir2, safe_serialization=True)")
        raise InputError(f"{self.root} has no *.safetensors files; pass an HF model dir with weights")

    def tensor_infos(self) -> dict[str, TensorInfo]:
        return self._infos

    def load(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        # A fresh mapping per tensor: get_tensor copies out of the mapping, and closing it
        # drops the mapped pages from our RSS, so peak memory stays near one tensor.
        with safe_open(self._ranges[name][0], framework="pt") as f:
            return f.get_tensor(name)

    def raw_range(self, name: str) -> tuple[Path, int, int] | None:
        return self._ranges[name]

    def files(self) -> list[Path]:
        return [self.root / "config.json", *self._shards]

    def write_tokenizer(self, out_dir: Path) -> list[str]:
        copied = []
        for name in TOKENIZER_FILES:
            if (self.root / name).is_file():
                (out_dir / name).write_bytes((self.root / name).read_bytes())
                copied.append(name)
        return copied


_ST_TO_TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _torch_dtype_name(st_dtype: str) -> str:
    return _ST_TO_TORCH[st_dtype]
