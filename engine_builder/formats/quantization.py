"""The quantization block of a checkpoint's config.json; the tensor layout it implies is quant_layout.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

QuantScheme = Literal["none", "int8_wo", "int4_wo", "int4_awq", "w8a8_sq", "fp8", "awq", "gptq", "gguf"]


@dataclass(frozen=True)
class CalibrationInfo:
    """Where the activation statistics of a calibrated scheme came from."""

    source: str  # file name, or "builtin:<name>" for the shipped text
    sha256: str
    samples: int
    seq_len: int


@dataclass(frozen=True)
class Quantization:
    """config.json's quantization block; the tensor layout it implies is in converters/quantize/FORMAT.md.

    scheme: how the weights were made. int8_wo / int4_wo are round-to-nearest, int4_awq adds
    activation-aware scales, w8a8_sq SmoothQuant, fp8 per-tensor e4m3; awq / gptq are
    pre-quantized Hugging Face checkpoints ingested as they are; gguf keeps a GGUF's Q4_0/Q4_1/Q4_K blocks.
    """

    scheme: QuantScheme = "none"
    weight_bits: int | None = None  # 8 or 4; None for none / fp8 (the dtype says it)
    group_size: int | None = None  # input channels per scale; None = one scale per output channel
    zero_point: bool = False  # asymmetric uint4 with zeros (ingested awq/gptq); TensorRT refuses it
    activation: Literal["none", "int8", "fp8"] = "none"  # static per-tensor activation quantization
    kv_cache: Literal["none", "int8", "fp8"] = "none"
    quantized: tuple[str, ...] = ()  # canonical linear prefixes stored quantized, e.g. "layers.0.attn.qkv"
    excluded: tuple[str, ...] = ()  # linear prefixes kept in full precision (--exclude; gguf: other block types)
    calibration: CalibrationInfo | None = None
    # how a quantized lm_head is stored: "same" as the body, or "int8" per output channel whatever the body
    # (convert --lm-head; the default for weight-only schemes, as llama.cpp keeps its output tensor at 6-8
    # bits under a 4-bit body). A float lm_head is simply not in `quantized`.
    lm_head: Literal["same", "int8"] = "same"
    # an int8 lm_head's input channels per scale: None per output channel; 32 for `--quant gguf --lm-head int8`,
    # which keeps a Q8_0 token table's own blocks (d * q per 32 inputs) exactly instead of re-rounding each row
    lm_head_group_size: int | None = None

    def for_linear(self, prefix: str) -> Quantization:
        """The block as linear PREFIX is stored: an int8 lm_head reads as int8_wo per output channel."""
        if prefix == "lm_head" and self.lm_head == "int8" and prefix in self.quantized:
            return dataclasses.replace(self, scheme="int8_wo", weight_bits=8, group_size=self.lm_head_group_size,
                                       zero_point=False, activation="none")
        return self
