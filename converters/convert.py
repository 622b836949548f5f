"""`trtbuild convert`: HF safetensors dir or GGUF file -> canonical checkpoint dir.

Tensors stream one at a time from the source (memory-mapped, lazy) into rank0.safetensors,
so peak memory stays at a few tensors whatever the model size.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from converters.base import Plan, TensorInfo, get_converter, plan_conversion
from converters.safetensors_writer import StreamingSafetensorsWriter
from converters.sources import Source, open_source
from engine_builder import __version__
from engine_builder.atomic_dir import atomic_output_dir, check_output_dir
from engine_builder.config import CheckpointConfig, ModelConfig, SourceFile, SourceFingerprint
from engine_builder.errors import InputError, UnsupportedError
from engine_builder.file_hash import sha256_file
from engine_builder.memory import PeakRss

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}  # dtype -> bytes per element
WEIGHTS_FILE = "rank0.safetensors"
CAST_CHUNK_BYTES = 4 << 20  # source bytes cast per step: a multiple of every element size


@dataclass(frozen=True)
class ConversionPlan:
    source: Source
    model: ModelConfig
    plan: Plan
    dtype: str

    @property
    def total_bytes(self) -> int:
        size = DTYPES[self.dtype]
        return sum(math.prod(t.shape) * size for t in self.plan.tensors)


@dataclass(frozen=True)
class ConvertResult:
    out: str
    model_type: str
    source_format: str
    dtype: str
    tensors: int
    bytes: int
    largest_tensor_bytes: int
    seconds: float
    mb_per_s: float
    peak_rss_bytes: int
    dropped: tuple[str, ...]
    tokenizer_files: tuple[str, ...]


def plan(src: Path, dtype: str = "auto") -> ConversionPlan:
    """Open SRC, normalize its config and map every tensor; reads no tensor data."""
    if dtype != "auto" and dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    source = open_source(Path(src))
    converter = get_converter(source.hf_config.get("model_type"))
    model = converter.config_from_hf(source.hf_config)
    model.validate()
    infos = source.tensor_infos()
    conversion = plan_conversion(converter, model, infos)
    if dtype == "auto":
        dtype = _auto_dtype(conversion, infos)
    return ConversionPlan(source, model, conversion, dtype)


def _auto_dtype(conversion: Plan, infos: dict[str, TensorInfo]) -> str:
    """The source's own float dtype, read from its embedding table."""
    embed = next(t for t in conversion.tensors if t.name == "embed.weight")
    dtype = infos[embed.sources[0]].dtype
    if dtype not in DTYPES:
        raise UnsupportedError(
            f"source embedding dtype {dtype} is not a float dtype trtbuild stores; "
            f"pass --dtype float16, bfloat16 or float32")
    return dtype


def convert(src: Path, out: Path, dtype: str = "auto", force: bool = False,
            progress: Callable[[int, int], None] | None = None) -> ConvertResult:
    """Convert SRC into checkpoint dir OUT. `progress(n, total)` hears of every n bytes written."""
    out = Path(out)
    check_output_dir(out, force)  # fail before any expensive work
    started = time.perf_counter()
    peak = PeakRss()
    cp = plan(src, dtype)
    itemsize = DTYPES[cp.dtype]
    infos = cp.source.tensor_infos()
    # hashing runs beside the conversion, a shard per thread: hashlib releases the GIL on
    # large buffers, and the unchanged-dtype copy itself runs in the kernel
    with ThreadPoolExecutor(max_workers=2) as pool:
        hashes = {p: pool.submit(sha256_file, p) for p in cp.source.files()}
        with atomic_output_dir(out, force) as tmp:
            layout = [(t.name, cp.dtype, t.shape) for t in cp.plan.tensors]
            largest = max(math.prod(t.shape) * itemsize for t in cp.plan.tensors)
            with StreamingSafetensorsWriter(tmp / WEIGHTS_FILE, layout, {"format": "pt"}) as writer:
                for t in cp.plan.tensors:
                    for name in t.sources:
                        _write_part(cp.source, writer, t.name, name, infos[name].dtype, cp.dtype)
                        if progress:
                            progress(math.prod(infos[name].shape) * itemsize, cp.total_bytes)
            tokenizer_files = cp.source.write_tokenizer(tmp)
            if "generation_config.json" not in tokenizer_files:
                if _write_generation_config(tmp, cp.source.hf_config):
                    tokenizer_files.append("generation_config.json")
            hf = cp.source.hf_config
            fingerprint = SourceFingerprint(
                format=cp.source.kind, model_type=hf.get("model_type", ""),
                architectures=tuple(hf.get("architectures") or ()),
                files=tuple(SourceFile(p.name, p.stat().st_size, f.result()) for p, f in hashes.items()))
            config = CheckpointConfig(model=cp.model, dtype=cp.dtype, source=fingerprint,
                                      num_tensors=len(cp.plan.tensors), trtbuild_version=__version__)
            (tmp / "config.json").write_text(config.to_json())
    seconds = time.perf_counter() - started
    total = cp.total_bytes
    return ConvertResult(
        out=str(out), model_type=cp.model.architecture, source_format=cp.source.kind, dtype=cp.dtype,
        tensors=len(cp.plan.tensors), bytes=total, largest_tensor_bytes=largest, seconds=round(seconds, 3),
        mb_per_s=round(total / 1e6 / seconds, 1), peak_rss_bytes=peak.above_baseline(),
        dropped=cp.plan.dropped, tokenizer_files=tuple(tokenizer_files))


def _write_part(source: Source, writer: StreamingSafetensorsWriter, canonical: str, name: str,
                source_dtype: str, dtype: str) -> None:
    """Append source tensor `name` to `canonical`: a kernel file-to-file copy when it is stored
    as-is in the right dtype, otherwise load it (one tensor in memory) and cast."""
    if source_dtype not in DTYPES:
        raise UnsupportedError(
            f"tensor {name!r} is {source_dtype}; pre-quantized checkpoints are not supported yet, "
            f"convert the unquantized model")
    raw = source.raw_range(name)
    if raw is not None and source_dtype == dtype:
        writer.append_range(canonical, *raw)
        return
    import torch  # only casts and dequantization need it

    if raw is None:  # e.g. GGUF blocks: dequantize the whole tensor
        writer.append(canonical, source.load(name).to(getattr(torch, dtype)))  # [rows, ...]
        return
    # cast in bounded chunks read with plain file I/O (no mapping whose pages would count as
    # ours), so memory stays at two chunks whatever the tensor size
    path, offset, nbytes = raw
    src_dtype, dst_dtype = getattr(torch, source_dtype), getattr(torch, dtype)
    buffer = bytearray(min(CAST_CHUNK_BYTES, nbytes))
    with open(path, "rb") as f:
        f.seek(offset)
        while nbytes:
            n = f.readinto(memoryview(buffer)[:min(len(buffer), nbytes)])
            if not n:
                raise InputError(f"{path} ended early while reading {name!r}; the file is truncated")
            part = torch.frombuffer(buffer, dtype=src_dtype, count=n // src_dtype.itemsize)  # flat
            writer.append(canonical, part.to(dst_dtype))
            nbytes -= n


def _write_generation_config(out: Path, hf: dict) -> bool:
    """Derive generation_config.json from config.json token ids, as transformers does."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    gen = {k: hf[k] for k in keys if hf.get(k) is not None}
    if not gen:
        return False
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return True
