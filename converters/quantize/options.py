"""What `trtbuild convert --quant ...` was asked for, checked before any expensive work."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from engine_builder.config import ModelConfig
from engine_builder.errors import InputError, UnsupportedError

# gguf: keep a GGUF file's own Q4_0/Q4_1/Q4_K blocks (converters/quantize/gguf_blocks.py), nothing re-quantized
SCHEMES = ("none", "int8_wo", "int4_wo", "int4_awq", "w8a8_sq", "fp8", "gguf")
# schemes whose scales come from activation statistics of calibration text
CALIBRATED = ("int4_awq", "w8a8_sq", "fp8")
INT4 = ("int4_wo", "int4_awq")
WEIGHT_BITS = {"int8_wo": 8, "w8a8_sq": 8, "int4_wo": 4, "int4_awq": 4}  # fp8: the dtype says it
GROUP_SIZES = (32, 64, 128)
GROUPED = (*INT4, "int8_wo")  # schemes with per-group scales: always for int4, on request for int8_wo
INT4_DEFAULT_GROUP = 128
KV_CACHE = ("none", "int8", "fp8")


@dataclass(frozen=True)
class QuantOptions:
    scheme: str = "none"
    # input channels per scale; None = the scheme's default: INT4_DEFAULT_GROUP for int4, one scale
    # per output channel for int8_wo (see `groups`)
    group_size: int | None = None
    kv_cache: str = "none"
    calib: Path | None = None  # None: the shipped calibration text
    # None: calibrate.DEFAULT_SAMPLES / DEFAULT_SEQ_LEN (not imported here: it loads onnxruntime)
    calib_samples: int | None = None
    calib_seq_len: int | None = None
    exclude: tuple[str, ...] = ()  # fnmatch patterns over linear prefixes kept in full precision

    @property
    def calibrated(self) -> bool:
        """Does the scheme take its scales from calibration text?"""
        return self.scheme in CALIBRATED

    @property
    def needs_calibration(self) -> bool:
        """Does anything asked for (the scheme, or an int8 KV cache's scales) need calibration text?"""
        return self.calibrated or self.kv_cache == "int8"

    @property
    def quantizing(self) -> bool:
        """Is the checkpoint changed at all: a scheme, or KV-cache scales to add?"""
        return self.scheme != "none" or self.kv_cache != "none"

    @property
    def groups(self) -> int | None:
        """Input channels per weight scale as the checkpoint stores them; None = per output channel."""
        if self.scheme in INT4:
            return self.group_size or INT4_DEFAULT_GROUP
        return self.group_size if self.scheme == "int8_wo" else None

    def validate(self) -> None:
        if self.scheme not in SCHEMES:
            raise InputError(f"--quant {self.scheme!r} is not a scheme; choose one of {', '.join(SCHEMES)}")
        if self.group_size is not None and self.group_size not in GROUP_SIZES:
            raise InputError(f"--group-size {self.group_size} is not supported; choose one of "
                             f"{', '.join(map(str, GROUP_SIZES))}")
        if self.scheme == "gguf" and (self.group_size is not None or self.kv_cache != "none"):
            raise UnsupportedError("--quant gguf keeps the file's own blocks of 32 inputs as they are, so it takes "
                                   "no --group-size, and no --kv-cache yet (its scales need a float checkpoint "
                                   "to calibrate); drop them, or use --quant int4_awq")
        if self.group_size is not None and self.scheme not in GROUPED:
            raise InputError(f"--group-size applies to {', '.join(GROUPED)}; --quant {self.scheme} has one weight "
                             f"scale per {'output channel' if self.scheme == 'w8a8_sq' else 'tensor'}, so drop it")
        if self.kv_cache not in KV_CACHE:
            raise InputError(f"--kv-cache {self.kv_cache!r} is not supported; choose one of {', '.join(KV_CACHE)}")
        if self.kv_cache == "fp8":
            # refused here rather than by `build` after a long convert: no target could run it
            raise UnsupportedError("--kv-cache fp8 is not supported: onnxruntime's CPU GroupQueryAttention has no "
                                   "fp8-cache kernel and TensorRT-RTX 1.7 updates only float16/bfloat16/float32 "
                                   "caches; use --kv-cache int8 (onnxruntime target) or --kv-cache none")
        if self.calib is not None and not self.needs_calibration:
            raise InputError(f"--calib only feeds the calibrated schemes ({', '.join(CALIBRATED)}) and "
                             f"--kv-cache int8; --quant {self.scheme} uses no calibration, so drop --calib")
        if any(n is not None and n <= 0 for n in (self.calib_samples, self.calib_seq_len)):
            raise InputError(f"--calib-samples and --calib-seq-len must be positive, got {self.calib_samples} "
                             f"and {self.calib_seq_len}")
        if self.scheme == "none" and self.exclude:
            raise InputError("--exclude picks linears to keep in full precision; it needs a --quant scheme")


def linear_prefixes(model: ModelConfig) -> tuple[str, ...]:
    """Every linear a scheme may quantize, by canonical prefix (FORMAT.md), in checkpoint order.

    lm_head is listed for tied models too: quantized, it gets its own tensors beside embed.weight."""
    per_layer = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
    return (*(f"layers.{i}.{p}" for i in range(model.num_layers) for p in per_layer), "lm_head")


def split_excluded(linears: tuple[str, ...], patterns: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quantized, excluded) prefixes; a pattern that matches no linear is a typo, so it is an error."""
    for pattern in patterns:
        if not fnmatch.filter(linears, pattern):
            raise InputError(f"--exclude {pattern!r} matches no linear; linears are named like "
                             f"{linears[0]}, {linears[1]}, layers.*.mlp.down, lm_head")
    excluded = tuple(p for p in linears if any(fnmatch.fnmatchcase(p, pat) for pat in patterns))
    return tuple(p for p in linears if p not in excluded), excluded


def in_features(model: ModelConfig, prefix: str) -> int:
    if prefix.endswith("attn.o"):
        return model.q_dim
    return model.intermediate_size if prefix.endswith("mlp.down") else model.hidden_size


def select_linears(model: ModelConfig, options: QuantOptions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quantized, excluded) linear prefixes of MODEL under OPTIONS, the group size checked against each.

    --quant none quantizes no linear (a KV-cache-only conversion)."""
    if options.scheme == "none":
        return (), ()
    quantized, excluded = split_excluded(linear_prefixes(model), options.exclude)
    if (group := options.groups) is not None:
        sizes = {p: in_features(model, p) for p in quantized}
        if bad := next((p for p, n in sizes.items() if n % group), None):
            fits = [g for g in GROUP_SIZES if all(n % g == 0 for n in sizes.values())]
            hint = (f"use --group-size {' or '.join(map(str, fits[::-1]))} for this model" if fits else
                    "no supported group size divides them all; use --quant int8_wo without --group-size, or "
                    "--exclude the linears")
            raise InputError(f"--group-size {group} does not divide {bad}'s {sizes[bad]} input channels; {hint}")
    return quantized, excluded
