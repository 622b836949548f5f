"""A GGUF file's own 4-bit blocks kept as they are: `trtbuild convert model.gguf OUT --quant gguf`.

llama.cpp's 4-bit block types give every run of 32 inputs of a weight row a scale and a minimum:

    Q4_0  fp16 d,           16 bytes of nibbles    w = d * (q - 8)      q in 0..15
    Q4_1  fp16 d, fp16 m,   16 bytes of nibbles    w = d * q + m
          nibble j of byte i: input i (low nibble) or input i + 16 (high nibble)
    Q4_K  256 inputs: fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, mn) for each run of 32,
          128 bytes of nibbles (bytes 32j..32j+31: run 2j in the low nibbles, 2j+1 in the high)
                                                   w = d * sc * q - dmin * mn

Each is w = s * (q - 8) + offset per run of 32 (s = d or d * sc, offset = m + 8 s): signed int4 codes
with one scale per 32 inputs, which is FORMAT.md's int4 row, plus a float offset per run (its gguf row).
So the canonical checkpoint dequantizes to exactly the weights the GGUF does, and the graph
(network/linear.py) keeps TensorRT's and onnxruntime's fused int4 GEMM for the codes and adds the
offsets as a small float product. Other block types (Q8_0, Q6_K, ...) are dequantized to float
and listed as kept float; a fused linear (qkv, gate_up) keeps its blocks only when every part has them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from converters.quantize.quant_options import split_excluded
from converters.quantize.scheme import get_scheme
from converters.registry import PlannedTensor
from converters.sources.gguf_codes import BLOCK, BLOCK_BYTES
from engine_builder.formats.checkpoint import linear_prefixes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quant_packing import FLOAT_DTYPES, pack_int4
from engine_builder.formats.quantization import Quantization
from engine_builder.util.errors import InputError

if TYPE_CHECKING:
    from converters.safetensors_writer import StreamingSafetensorsWriter
    from converters.sources.gguf import GGUFSource
    from converters.sources.source import Source

def kept_linears(source: Source, model: ModelConfig, tensors: tuple[PlannedTensor, ...],
                 exclude: tuple[str, ...], lm_int8: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(linears whose every part is a Q4_0/Q4_1/Q4_K tensor, the other linears) by canonical prefix; the
    first are stored as blocks, the rest float. --exclude patterns send a linear to the second; with
    LM_INT8 (--lm-head int8) lm_head is in neither: it is stored int8 (append_int8_lm_head)."""
    if source.kind != "gguf":
        raise InputError(f"--quant gguf keeps a GGUF file's own 4-bit blocks, but the source is a {source.kind} "
                         f"checkpoint; use --quant int4_awq (or int4_wo) to quantize it")
    planned = {t.name: t for t in tensors}
    types = source.block_types()  # HF name -> ggml type name
    _, excluded = split_excluded(linear_prefixes(model), exclude)
    kept, floats = [], []
    for p in linear_prefixes(model):
        if f"{p}.weight" not in planned or (lm_int8 and p == "lm_head"):  # a tied or an int8 lm_head
            continue
        blocks = all(types[s] in BLOCK_BYTES for s in planned[f"{p}.weight"].sources)
        (kept if blocks and p not in excluded else floats).append(p)
    if not kept:
        found = sorted({types[s] for p in floats for s in planned[f"{p}.weight"].sources})
        raise InputError(f"{source.files()[0].name} has no linear stored as Q4_0, Q4_1 or Q4_K (its linears are "
                         f"{', '.join(found)}{', or --exclude matched them all' if exclude else ''}); convert "
                         f"without --quant to dequantize it, or with --quant int4_awq to re-quantize it")
    return tuple(kept), tuple(floats)


def quantization_block(kept: tuple[str, ...], floats: tuple[str, ...], lm_int8: bool = False) -> Quantization:
    if lm_int8:
        return Quantization(scheme="gguf", weight_bits=4, group_size=BLOCK, quantized=(*kept, "lm_head"),
                            excluded=floats, lm_head="int8", lm_head_group_size=BLOCK)
    return Quantization(scheme="gguf", weight_bits=4, group_size=BLOCK, quantized=kept, excluded=floats)


def linear_layout(t: PlannedTensor, dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The tensors of planned weight `t` ([out, in]): FORMAT.md's gguf row."""
    prefix = t.name.removesuffix(".weight")
    out, inp = t.shape
    return [(t.name, "uint8", (out, inp // 2)), (f"{prefix}.weight_scale", dtype, (out, inp // BLOCK)),
            (f"{prefix}.weight_offset", dtype, (out, inp // BLOCK))]


def append_linear(source: GGUFSource, writer: StreamingSafetensorsWriter, t: PlannedTensor, dtype: str) -> None:
    """Write planned weight `t`: its parts' codes, then scales, then offsets, each fused by rows."""
    parts = [source.load_blocks(name) for name in t.sources]
    prefix = t.name.removesuffix(".weight")
    for codes, _, _ in parts:
        writer.append(t.name, pack_int4(codes))  # [rows, in/2]
    for suffix, i in (("weight_scale", 1), ("weight_offset", 2)):
        for part in parts:
            writer.append(f"{prefix}.{suffix}", part[i].astype(FLOAT_DTYPES[dtype]))  # [rows, in/32]


def int8_lm_head_layout(shape: tuple[int, ...], dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """--lm-head int8: lm_head as int8_wo stores it with one scale per 32 inputs, whatever block type the file has."""
    return get_scheme("int8_wo").layout("lm_head", *shape, dtype, BLOCK)


def append_int8_lm_head(writer: StreamingSafetensorsWriter, w: np.ndarray, dtype: str) -> None:
    """Write lm_head (float32 [vocab, hidden]: the file's output or tied token_embd tensor, dequantized) as
    int8 with one scale per 32 inputs: the draft lm_head of a speculative pair, a quarter of the float bytes that
    dominate a small int4 model's step. A Q8_0 table (SmolLM2's) is d * q per block of 32 with d = amax / 127, so
    rounding each block again gives back its own codes and scale: the file's exact head (per output channel, as
    before, each weight moved by up to half a step of its row's scale, and the draft agreed on fewer tokens)."""
    int8 = get_scheme("int8_wo")
    for (name, stored, _), array in zip(int8.layout("lm_head", *w.shape, dtype, BLOCK),
                                        int8.quantize(w, BLOCK, None)):
        writer.append(name, array.astype(FLOAT_DTYPES[stored]) if stored in FLOAT_DTYPES else array)
