"""quantize_checkpoint: a float checkpoint dir -> a quantized checkpoint dir (FORMAT.md), a tensor at a time.

Quantized means its linears (--quant), its KV cache (--kv-cache int8: per-channel scales appended
after every other tensor), or both.

The float checkpoint is read with plain file I/O, one tensor at a time, and the quantized one
is streamed with StreamingSafetensorsWriter, so outside calibration memory stays at a few
tensors. Tensors that neither quantization nor folding changes are copied file to file.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from converters.quantize.calibrated_scales import channel_scales, clipped_weight, input_scales
from converters.quantize.folding import Folding
from converters.quantize.kv_cache_scales import SCALE_DTYPE, kv_cache_scales
from converters.quantize.quant_options import QuantOptions, select_linears
from converters.quantize.scheme import Layout, get_scheme
from converters.safetensors_writer import StreamingSafetensorsWriter
from converters.sources.source import safetensors_header
from engine_builder.formats.checkpoint import WEIGHTS_FILE, CheckpointConfig
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quant_packing import FLOAT_DTYPES
from engine_builder.formats.quantization import CalibrationInfo, Quantization
from engine_builder.util.errors import InputError
from engine_builder.util.version import __version__

if TYPE_CHECKING:
    from converters.quantize.calibration_text import CalibrationText

# progress(stage, done, total): "calibrating" counts windows of text, "quantizing" bytes of the float checkpoint
Progress = Callable[[str, int, int], None]

_ST_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


@dataclass(frozen=True)
class QuantizeResult:
    scheme: str
    quantized: tuple[str, ...]
    excluded: tuple[str, ...]
    tensors: int
    bytes: int  # of the tensors in rank0.safetensors
    calibration: CalibrationInfo | None
    calibration_seconds: float
    kv_cache: str = "none"


class FloatTensors:
    """The tensors of a float rank0.safetensors, read one at a time without mapping the file."""

    def __init__(self, path: Path):
        self.path = path
        header_len, header = safetensors_header(path)
        self.meta = {name: (m["dtype"], tuple(m["shape"]), 8 + header_len + m["data_offsets"][0],
                            m["data_offsets"][1] - m["data_offsets"][0])
                     for name, m in header.items() if name != "__metadata__"}
        self.meta = dict(sorted(self.meta.items(), key=lambda item: item[1][2]))  # file order

    def shape(self, name: str) -> tuple[int, ...]:
        return self.meta[name][1]

    def range(self, name: str) -> tuple[Path, int, int]:
        _, _, offset, nbytes = self.meta[name]
        return self.path, offset, nbytes

    def read(self, name: str) -> np.ndarray:
        """Tensor `name` as float32."""
        dtype, shape, offset, nbytes = self.meta[name]
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(nbytes)
        # read-only and, for F32, the file's bytes themselves: folding and quantizing make their own arrays
        return np.frombuffer(data, _ST_NUMPY[dtype]).astype(np.float32, copy=False).reshape(shape)


def quantize_checkpoint(fp_ckpt_dir: Path, out_dir: Path, options: QuantOptions, progress: Progress | None = None,
                        text: CalibrationText | None = None) -> QuantizeResult:
    """Write the OPTIONS.scheme (and OPTIONS.kv_cache) checkpoint of float checkpoint FP_CKPT_DIR into the
    existing dir OUT_DIR.

    `text` is the calibration text when the caller has loaded it already (else options.calib)."""
    options.validate()
    if not options.quantizing:
        raise InputError("quantize_checkpoint needs a scheme or a KV cache to quantize; --quant none --kv-cache "
                         "none keeps the float checkpoint as it is")
    fp_ckpt_dir, out_dir = Path(fp_ckpt_dir), Path(out_dir)
    cfg = CheckpointConfig.load(fp_ckpt_dir)
    if cfg.quantization.scheme != "none":
        raise InputError(f"{fp_ckpt_dir} is already quantized ({cfg.quantization.scheme}); quantize the float "
                         f"checkpoint, or convert the source again with --quant")
    model = cfg.model
    tensors = FloatTensors(fp_ckpt_dir / WEIGHTS_FILE)
    quantized, excluded = select_linears(model, options)
    shapes = {p: tensors.shape(_weight_of(p, model.tie_word_embeddings)) for p in quantized}  # [out, in]
    # --lm-head int8: lm_head is stored int8 per output channel, outside the scheme (no smoothing, clipping or
    # activation scale: its body's algorithms and limits are for the scheme's bits)
    lm_int8 = options.lm_head_mode == "int8" and "lm_head" in quantized
    body = tuple(p for p in quantized if not (lm_int8 and p == "lm_head"))

    calibration, calib_seconds, calib = None, 0.0, None
    if options.needs_calibration:  # once, for the scheme and the KV cache alike
        from converters.quantize import calibrate, calibration_text

        started = time.perf_counter()
        calib = calibrate.collect(
            fp_ckpt_dir, text or calibration_text.load(options.calib),
            options.calib_samples or calibrate.DEFAULT_SAMPLES, _calib_seq_len(model, options.calib_seq_len),
            progress=(lambda done, total: progress("calibrating", done, total)) if progress else None,
            caches=options.kv_cache == "int8")
        calibration, calib_seconds = calib.info, round(time.perf_counter() - started, 3)
    cache_scales = kv_cache_scales(calib.caches) if calib else {}  # name -> f32 [kv_heads, head_dim]
    scheme = get_scheme(options.scheme) if options.scheme != "none" else None
    scales = channel_scales(scheme, model, body, tensors.read, calib, options.groups) if scheme else {}
    folding = Folding(model, scales)
    activation_scales = input_scales(scheme, body, calib, scales) if scheme else {}
    int8 = get_scheme("int8_wo")

    # the source tensor of each output tensor, in file order; a tied lm_head comes from embed.weight, last
    plan: list[tuple[str, str]] = [(name, name) for name in tensors.meta]
    if model.tie_word_embeddings and "lm_head" in quantized:
        plan.append(("lm_head.weight", "embed.weight"))
    layout: Layout = []
    for out_name, src in plan:
        prefix = out_name.removesuffix(".weight")
        if lm_int8 and prefix == "lm_head":
            layout += int8.layout(prefix, *shapes[prefix], cfg.dtype, None)
        elif prefix in quantized:
            layout += scheme.layout(prefix, *shapes[prefix], cfg.dtype, options.groups)
        else:
            layout.append((out_name, cfg.dtype, tensors.shape(src)))
    layout += [(name, SCALE_DTYPE, scale.shape) for name, scale in cache_scales.items()]  # new tensors: last

    total = sum(tensors.meta[src][3] for _, src in plan)
    with StreamingSafetensorsWriter(out_dir / WEIGHTS_FILE, layout, {"format": "pt"}) as writer:
        for out_name, src in plan:
            prefix = out_name.removesuffix(".weight")
            if lm_int8 and prefix == "lm_head":
                w = tensors.read(src)  # [vocab, hidden] f32
                w = folding.apply(src, w) if folding.touches(src) else w
                for (name, dtype, _), array in zip(int8.layout(prefix, *w.shape, cfg.dtype, None),
                                                   int8.quantize(w, None, None)):
                    writer.append(name, _stored(array, dtype))
            elif prefix in quantized:
                w = tensors.read(src)  # [out, in] f32
                w = folding.apply(src, w) if folding.touches(src) else w
                w = clipped_weight(scheme, prefix, w, calib, scales, options.groups)
                arrays = scheme.quantize(w, options.groups, activation_scales.get(prefix))
                parts = scheme.layout(prefix, *w.shape, cfg.dtype, options.groups)
                for (name, dtype, _), array in zip(parts, arrays):
                    writer.append(name, _stored(array, dtype))
            elif folding.touches(src):
                writer.append(out_name, _stored(folding.apply(src, tensors.read(src)), cfg.dtype))
            else:
                writer.append_range(out_name, *tensors.range(src))
            if progress:
                progress("quantizing", tensors.meta[src][3], total)
        for name, scale in cache_scales.items():  # a few KB: not counted in the progress total
            writer.append(name, scale)

    for extra in sorted(fp_ckpt_dir.iterdir()):  # tokenizer and generation config files
        if extra.is_file() and extra.name not in ("config.json", WEIGHTS_FILE):
            shutil.copy2(extra, out_dir / extra.name)
    block = Quantization(
        scheme=options.scheme, weight_bits=scheme.weight_bits if scheme else None, group_size=options.groups,
        activation=scheme.activation if scheme else "none", kv_cache=options.kv_cache,
        quantized=quantized, excluded=excluded, calibration=calibration, lm_head="int8" if lm_int8 else "same")
    config = replace(cfg, quantization=block, num_tensors=len(layout), trtbuild_version=__version__)
    (out_dir / "config.json").write_text(config.to_json())
    nbytes = (out_dir / WEIGHTS_FILE).stat().st_size - 8 - safetensors_header(out_dir / WEIGHTS_FILE)[0]
    return QuantizeResult(options.scheme, quantized, excluded, len(layout), nbytes, calibration, calib_seconds,
                          options.kv_cache)


def _calib_seq_len(model: ModelConfig, asked: int | None) -> int:
    """--calib-seq-len, or the default window cut to the positions a learned table has (gpt2)."""
    from converters.quantize import calibrate

    limit = model.max_position_embeddings if model.position_embedding == "learned" else None
    if asked and limit and asked > limit:
        raise InputError(f"--calib-seq-len {asked} is past the {limit} positions this {model.architecture} model "
                         f"learned (max_position_embeddings); pass {limit} or less")
    return asked or min(calibrate.DEFAULT_SEQ_LEN, limit or calibrate.DEFAULT_SEQ_LEN)


def _weight_of(prefix: str, tied: bool) -> str:
    """The float tensor that holds linear `prefix`'s weight: a tied lm_head is the embedding table."""
    return "embed.weight" if prefix == "lm_head" and tied else f"{prefix}.weight"


def _stored(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` as stored: floats cast to `dtype`, integer codes (and fp8 bytes) as they are."""
    return np.asarray(array).astype(FLOAT_DTYPES[dtype], copy=False) if dtype in FLOAT_DTYPES else array
