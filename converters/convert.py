"""`trtbuild convert`: HF safetensors dir or GGUF file -> canonical checkpoint dir.

Tensors stream one at a time from the source (memory-mapped, lazy) into rank0.safetensors,
so peak memory stays at a few tensors whatever the model size. With --quant or --kv-cache the
float checkpoint is written to a scratch dir inside the temp output first, then quantized from
there (converters/quantize/quantized_checkpoint.py); pre-quantized AWQ / GPTQ sources are
re-laid out as they stream (converters/sources/prequantized.py).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converters.quantize import gguf_blocks
from converters.quantize.quant_options import QuantOptions, select_linears
from converters.quantize.quantized_checkpoint import Progress, quantize_checkpoint
from converters.registry import Plan, PlannedTensor, TensorInfo, get_converter, plan_conversion
from converters.safetensors_writer import ST_DTYPES, StreamingSafetensorsWriter
from converters.sources import prequantized
from converters.sources.open_source import open_source
from converters.sources.prequantized import PrequantizedFormat
from converters.sources.source import Source
from engine_builder.formats.checkpoint import (
    CHECKPOINT_SCHEMA,
    WEIGHTS_FILE,
    CheckpointConfig,
    SourceFile,
    SourceFingerprint,
)
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.formats.precision import tensor_groups
from engine_builder.formats.quantization import Quantization
from engine_builder.util.atomic_dir import atomic_output_dir, check_output_dir
from engine_builder.util.errors import InputError, UnsupportedError
from engine_builder.util.file_hash import sha256_file
from engine_builder.util.memory import PeakRss
from engine_builder.util.version import __version__

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}  # dtype -> bytes per element
CAST_CHUNK_BYTES = 4 << 20  # source bytes cast per step: a multiple of every element size
FLOAT_SCRATCH = ".float-checkpoint"  # inside the temp output: the float checkpoint --quant starts from
TOKENIZER_MODELS = ("tokenizer.json", "tokenizer.model", "vocab.json")  # an HF dir needs one to tokenize


@dataclass(frozen=True)
class ConversionPlan:
    source: Source
    model: ModelConfig
    plan: Plan
    dtype: str
    infos: dict[str, TensorInfo]  # the source's, a packed linear standing as its [out, in] weight
    prequantized: PrequantizedFormat | None = None
    quantization: Quantization = Quantization()  # what the source's own blocks keep (--quant gguf)

    def packed(self, t: PlannedTensor) -> bool:
        """Is planned tensor `t` a linear weight that a pre-quantized source stores packed?"""
        return self.infos[t.sources[0]].dtype == prequantized.WEIGHT_DTYPE

    def gguf_blocks(self, t: PlannedTensor) -> bool:
        """Is planned tensor `t` a linear weight kept as the GGUF's own 4-bit blocks?"""
        return (self.quantization.scheme == "gguf" and t.name.removesuffix(".weight") in self.quantization.quantized
                and not self.int8_lm_head(t))

    def int8_lm_head(self, t: PlannedTensor) -> bool:
        """Is planned tensor `t` lm_head stored int8 beside the GGUF's blocks (--quant gguf --lm-head int8)?"""
        return self.quantization.scheme == "gguf" and self.quantization.lm_head == "int8" and t.name == "lm_head.weight"

    @property
    def total_bytes(self) -> int:
        """Bytes of the float checkpoint (packed linears counted as float: a progress total)."""
        size = DTYPES[self.dtype]
        return sum(math.prod(t.shape) * size for t in self.plan.tensors)


@dataclass(frozen=True)
class ConvertResult:
    out: str
    model_type: str
    source_format: str
    dtype: str
    tensors: int
    bytes: int  # of the tensors in OUT's rank0.safetensors
    largest_tensor_bytes: int
    seconds: float
    mb_per_s: float
    peak_rss_bytes: int
    dropped: tuple[str, ...]
    tokenizer_files: tuple[str, ...]
    quantization: str = "none"  # the scheme: --quant's, or awq / gptq for an ingested source
    kv_cache: str = "none"  # --kv-cache's: int8 adds per-channel cache scales
    quantized: int = 0  # linears stored quantized
    excluded: tuple[str, ...] = ()  # linears kept in full precision
    calibration_seconds: float = 0.0
    precision: dict[str, str] | None = None  # embeddings / body / lm_head -> precision (formats/precision.py)


def plan(src: Path, dtype: str = "auto", quant: str = "none", exclude: tuple[str, ...] = (),
         lm_head: str | None = None) -> ConversionPlan:
    """Open SRC, normalize its config and map every tensor; reads no tensor data.

    QUANT "gguf" keeps the 4-bit blocks of a GGUF source (but the linears EXCLUDE matches) as they are;
    with LM_HEAD "int8" lm_head is stored int8 per output channel instead."""
    if dtype != "auto" and dtype not in DTYPES:
        raise InputError(f"--dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    source = open_source(Path(src))
    fmt = prequantized.detect(source.hf_config)
    converter = get_converter(source.hf_config.get("model_type"))
    try:
        model = converter.config_from_source(source.hf_config, getattr(source, "root", None))
    # a field of the wrong type or missing (rms_norm_eps "tiny"), or absurd (num_hidden_layers 2**66 overflows a tuple)
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc).replace("\n", " ")
        raise InputError(f"{src}: config.json cannot describe a {converter.model_type} model ({what}); fix that "
                         "field") from None
    model.validate()
    infos = source.tensor_infos()
    if fmt:
        infos = prequantized.weight_infos(infos, fmt)
    conversion = plan_conversion(converter, model, infos)
    if fmt and any(t.transforms and infos[t.sources[0]].dtype == prequantized.WEIGHT_DTYPE
                   for t in conversion.tensors):
        raise UnsupportedError(f"{src}: pre-quantized ({fmt.method}) {converter.model_type} weights would need "
                               f"re-laying out packed; convert the unquantized original (with --quant to quantize)")
    if dtype == "auto":
        dtype = _auto_dtype(conversion, infos)
    kept = Quantization()
    if quant == "gguf":
        lm_int8 = lm_head == "int8"
        kept = gguf_blocks.quantization_block(*gguf_blocks.kept_linears(source, model, conversion.tensors, exclude,
                                                                        lm_int8), lm_int8)
    return ConversionPlan(source, model, conversion, dtype, infos, fmt, kept)


def _auto_dtype(conversion: Plan, infos: dict[str, TensorInfo]) -> str:
    """The source's own float dtype, read from its embedding table."""
    embed = next(t for t in conversion.tensors if t.name == "embed.weight")
    dtype = infos[embed.sources[0]].dtype
    if dtype not in DTYPES:
        raise UnsupportedError(
            f"source embedding dtype {dtype} is not a float dtype trtbuild stores; "
            f"pass --dtype float16, bfloat16 or float32")
    return dtype


def convert(src: Path, out: Path, dtype: str = "auto", force: bool = False, quant: str = "none",
            group_size: int | None = None, kv_cache: str = "none", calib: Path | None = None,
            calib_samples: int | None = None, calib_seq_len: int | None = None, exclude: Iterable[str] = (),
            progress: Progress | None = None, lm_head: str | None = None, tp: int = 1, pp: int = 1) -> ConvertResult:
    """Convert SRC into checkpoint dir OUT, quantized with scheme QUANT unless it is "none", and with
    int8 KV-cache scales when KV_CACHE is "int8".

    The keywords are `trtbuild convert`'s options (see its --help). `dtype` "auto" keeps the
    source's float dtype, or float32 with a --quant scheme. `progress(stage, n, total)` hears of every
    n bytes written ("converting", "quantizing") and of calibration windows ("calibrating")."""
    out = Path(out)
    inputs = (src, calib)  # --force never deletes what it reads
    check_output_dir(out, force, inputs, CHECKPOINT_SCHEMA)  # fail before any expensive work
    options = QuantOptions(quant, group_size, kv_cache, Path(calib) if calib else None, calib_samples,
                           calib_seq_len, tuple(exclude), lm_head)
    options.validate()
    started = time.perf_counter()
    peak = PeakRss()
    # a second pass over a float checkpoint; --quant gguf keeps the source's blocks while converting instead
    quantizing = options.quantizing and options.scheme != "gguf"
    # only a scheme's weights default to float32; a KV cache's scales are float32 whatever the weights
    cp = plan(src, "float32" if options.scheme != "none" and dtype == "auto" else dtype, options.scheme,
              options.exclude, options.lm_head)
    mapping = ParallelMapping(tp, pp)
    mapping.check(cp.model)  # a mapping the model cannot divide fails before any work, with the valid values
    if mapping.world_size > 1 and (options.quantizing or cp.prequantized or cp.quantization.scheme != "none"):
        raise UnsupportedError("--tp/--pp shard float checkpoints only; drop --quant / --kv-cache (or convert the "
                               "unquantized original)")
    if cp.prequantized and options.scheme != "none":
        raise InputError(f"{src} is already quantized ({cp.prequantized.method}); it is ingested as it is, "
                         f"so drop --quant {options.scheme} (or convert its unquantized original with it)")
    if cp.prequantized and options.kv_cache != "none":
        raise UnsupportedError(f"--kv-cache {options.kv_cache} is not supported yet for a pre-quantized "
                               f"({cp.prequantized.method}) source; drop --kv-cache, or convert its unquantized "
                               f"original with --quant int4_awq --kv-cache {options.kv_cache}")
    if quantizing:
        select_linears(cp.model, options)  # a bad --exclude or --group-size fails before any work
    if options.needs_calibration:
        _check_calibration_memory(cp.model, src, options)
    text = None
    if options.needs_calibration:  # a missing or empty --calib file fails now, not after the float checkpoint
        from converters.quantize import calibration_text

        text = calibration_text.load(options.calib)
        if cp.source.kind == "hf-safetensors" and not any((Path(src) / f).is_file() for f in TOKENIZER_MODELS):
            what = f"--quant {options.scheme}" if options.calibrated else f"--kv-cache {options.kv_cache}"
            fix = ("use --quant int8_wo or int4_wo, which need no calibration" if options.calibrated else
                   "use --kv-cache none")
            raise InputError(f"{what} calibrates on text tokenized with the model's tokenizer, but {src} has no "
                             f"{', '.join(TOKENIZER_MODELS)}; add them, or {fix}")
    # hashing runs beside the conversion, a shard per thread: hashlib releases the GIL on
    # large buffers, and the unchanged-dtype copy itself runs in the kernel
    with ThreadPoolExecutor(max_workers=2) as pool:
        hashes = {p: pool.submit(sha256_file, p) for p in cp.source.files()}
        with atomic_output_dir(out, force, inputs, CHECKPOINT_SCHEMA) as tmp:
            float_dir = tmp / FLOAT_SCRATCH if quantizing else tmp
            float_dir.mkdir(exist_ok=True)
            written = _write_checkpoint(cp, float_dir, hashes, progress)
            if quantizing:
                result = quantize_checkpoint(float_dir, tmp, options, progress, text)
                shutil.rmtree(float_dir)
                written = _Written(result.tensors, result.bytes, written.largest, written.tokenizer_files,
                                   result.scheme, len(result.quantized), result.excluded,
                                   result.calibration_seconds, result.kv_cache)
            if mapping.world_size > 1:  # torch only here: a refusal before any work need not import it
                from converters.parallel_shard import shard_checkpoint

                shard_checkpoint(tmp, mapping)  # rank{i}.safetensors (converters/parallel_shard.py)
            final = CheckpointConfig.load(tmp)  # what was written: its precision per tensor group
    seconds = time.perf_counter() - started
    return ConvertResult(
        out=str(out), model_type=cp.model.architecture, source_format=cp.source.kind, dtype=cp.dtype,
        tensors=written.tensors, bytes=written.bytes, largest_tensor_bytes=written.largest,
        seconds=round(seconds, 3), mb_per_s=round(written.bytes / 1e6 / seconds, 1),
        peak_rss_bytes=peak.above_baseline(), dropped=cp.plan.dropped, tokenizer_files=written.tokenizer_files,
        quantization=written.scheme, kv_cache=written.kv_cache, quantized=written.quantized,
        excluded=written.excluded, calibration_seconds=written.calibration_seconds,
        precision=tensor_groups(final.model, final.dtype, final.quantization))


def _check_calibration_memory(model: ModelConfig, src: Path, options: QuantOptions) -> None:
    """Converting streams a tensor at a time, but calibration runs the whole float32 model on a window of
    --calib-seq-len tokens: weigh that against this machine (formats/memory_plan.py) before the float
    checkpoint is written, from the config already read (a GGUF's header takes seconds to parse)."""
    from converters.quantize import calibrate
    from engine_builder.formats.build_config import MAX_LIMITS, Limits
    from engine_builder.formats.memory_plan import check_engine_memory

    window = options.calib_seq_len or calibrate.DEFAULT_SEQ_LEN
    if window > MAX_LIMITS["max_seq_len"]:
        raise InputError(f"--calib-seq-len {window} is above {MAX_LIMITS['max_seq_len']}; a few hundred tokens "
                         f"per window calibrate well (default {calibrate.DEFAULT_SEQ_LEN})")
    check_engine_memory(model, Limits(max_batch=1, max_input_len=window, max_seq_len=window), "float32",
                        what=f"calibrating {src} on windows of {window} tokens")


@dataclass(frozen=True)
class _Written:
    tensors: int
    bytes: int
    largest: int
    tokenizer_files: tuple[str, ...]
    scheme: str = "none"
    quantized: int = 0
    excluded: tuple[str, ...] = ()
    calibration_seconds: float = 0.0
    kv_cache: str = "none"


def _write_checkpoint(cp: ConversionPlan, out: Path, hashes: dict[Path, Future[str]],
                      progress: Progress | None) -> _Written:
    """Stream the planned tensors into OUT (a float checkpoint, or the re-laid-out pre-quantized one)."""
    itemsize = DTYPES[cp.dtype]
    quantization, sym = cp.quantization, False
    if cp.prequantized:
        quantization = prequantized.quantization_block(cp.source, cp.model, cp.plan.tensors, cp.infos,
                                                       cp.prequantized)
        sym = not quantization.zero_point
    layout = []
    for t in cp.plan.tensors:
        if cp.packed(t):
            layout += prequantized.linear_layout(t, cp.dtype, cp.prequantized.group_size, sym)
        elif cp.gguf_blocks(t):
            layout += gguf_blocks.linear_layout(t, cp.dtype)
        elif cp.int8_lm_head(t):
            layout += gguf_blocks.int8_lm_head_layout(t.shape, cp.dtype)
        else:
            layout.append((t.name, cp.dtype, t.shape))
    tied_int8_head = cp.quantization.lm_head == "int8" and all(t.name != "lm_head.weight" for t in cp.plan.tensors)
    if tied_int8_head:  # a tied lm_head gets its own int8 table, last (the embedding stays float for the gather)
        embed = next(t for t in cp.plan.tensors if t.name == "embed.weight")
        layout += gguf_blocks.int8_lm_head_layout(embed.shape, cp.dtype)
    with StreamingSafetensorsWriter(out / WEIGHTS_FILE, layout, {"format": "pt"}) as writer:
        for t in cp.plan.tensors:
            if cp.packed(t):
                prequantized.append_linear(cp.source, writer, t, cp.prequantized, cp.dtype, sym)
            elif cp.gguf_blocks(t):
                gguf_blocks.append_linear(cp.source, writer, t, cp.dtype)
            elif cp.int8_lm_head(t):
                gguf_blocks.append_int8_lm_head(writer, _float_tensor(cp, t), cp.dtype)
            else:
                for name, transform in zip(t.sources, t.transforms or (None,) * len(t.sources)):
                    if transform is None:
                        _write_part(cp.source, writer, t.name, name, cp.infos[name].dtype, cp.dtype)
                    else:  # re-laid out: the whole tensor in memory, then cast
                        import torch

                        _check_float(name, cp.infos[name].dtype)
                        writer.append(t.name, transform.apply(cp.source.load(name), cp.model)
                                      .to(getattr(torch, cp.dtype)))
                    if progress:
                        progress("converting", math.prod(cp.infos[name].shape) * itemsize, cp.total_bytes)
                continue
            if progress:
                progress("converting", math.prod(t.shape) * itemsize, cp.total_bytes)
        if tied_int8_head:
            gguf_blocks.append_int8_lm_head(writer, _float_tensor(cp, embed), cp.dtype)
    tokenizer_files = cp.source.write_tokenizer(out)
    if "generation_config.json" not in tokenizer_files:
        if _write_generation_config(out, cp.source.hf_config):
            tokenizer_files.append("generation_config.json")
    hf = cp.source.hf_config
    archs = hf.get("architectures")  # informational only: a hand-edited non-list is recorded as none
    fingerprint = SourceFingerprint(
        format=cp.source.kind, model_type=hf.get("model_type", ""),
        architectures=tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        files=tuple(SourceFile(p.name, p.stat().st_size, f.result()) for p, f in hashes.items()))
    config = CheckpointConfig(model=cp.model, dtype=cp.dtype, source=fingerprint, quantization=quantization,
                              num_tensors=len(layout), trtbuild_version=__version__)
    (out / "config.json").write_text(config.to_json())
    sizes = [math.prod(shape) * ST_DTYPES[dtype][1] for _, dtype, shape in layout]
    return _Written(len(layout), sum(sizes), max(sizes), tuple(tokenizer_files), quantization.scheme,
                    len(quantization.quantized), quantization.excluded)


def _write_part(source: Source, writer: StreamingSafetensorsWriter, canonical: str, name: str,
                source_dtype: str, dtype: str) -> None:
    """Append source tensor `name` to `canonical`: a kernel file-to-file copy when it is stored
    as-is in the right dtype, otherwise load it (one tensor in memory) and cast."""
    _check_float(name, source_dtype)
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


def _float_tensor(cp: ConversionPlan, t: PlannedTensor) -> np.ndarray:
    """Planned tensor `t` whole, as float32 (its parts loaded, re-laid out and stacked by rows)."""
    import torch

    parts = []
    for name, transform in zip(t.sources, t.transforms or (None,) * len(t.sources)):
        w = cp.source.load(name)
        parts.append((transform.apply(w, cp.model) if transform is not None else w).to(torch.float32))
    return torch.cat(parts).reshape(t.shape).numpy()


def _check_float(name: str, source_dtype: str) -> None:
    if source_dtype not in DTYPES:
        raise UnsupportedError(
            f"tensor {name!r} is {source_dtype}, not a float dtype; of pre-quantized checkpoints trtbuild ingests "
            f"AutoAWQ (gemm) and GPTQ ones declared in config.json's quantization_config: convert the "
            f"unquantized model (with --quant to quantize it here)")


def _write_generation_config(out: Path, hf: dict) -> bool:
    """Derive generation_config.json from config.json token ids, as transformers does."""
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    gen = {k: hf[k] for k in keys if hf.get(k) is not None}
    if not gen:
        return False
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return True
