"""Where a quantized linear's tensors are in rank0.safetensors and how the graph reads their bytes.

The table of converters/quantize/FORMAT.md, per linear: the stored dtype and shape of each tensor
(checked before the graph is emitted) and, for packed int4, the ONNX INT4/UINT4 view of the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import onnx_ir as ir

from engine_builder.formats.quantization import Quantization, QuantScheme
from engine_builder.util.errors import InputError, UnsupportedError

F32 = ir.DataType.FLOAT
FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


@dataclass(frozen=True)
class StoredLayout:
    """One tensor of a quantized linear as FORMAT.md stores it, and how the graph reads it."""

    stored: tuple[ir.DataType, ...]  # accepted safetensors dtypes (scales: any float type)
    shape: tuple[int, ...]  # as stored
    view: ir.DataType | None = None  # the graph's view of the bytes (INT4 for packed U8); None = as stored
    view_shape: tuple[int, ...] | None = None


def check_scheme(q: Quantization) -> None:
    schemes = get_args(QuantScheme)
    if q.scheme not in schemes:
        raise UnsupportedError(f"the checkpoint is quantized with scheme {q.scheme!r}, which this trtbuild does not "
                               f"know ({', '.join(schemes)}); re-run `trtbuild convert --quant` with this version")


def weight_kind(q: Quantization) -> str:
    """'int8' (per channel, or blocked with a group_size), 'int4' (blocked) or 'fp8' (per tensor)."""
    if q.scheme == "fp8":
        return "fp8"
    if q.weight_bits in (4, 8):
        return f"int{q.weight_bits}"
    raise UnsupportedError(f"quantization scheme {q.scheme!r} with weight_bits {q.weight_bits} has no graph "
                           f"form; re-run `trtbuild convert --quant` with int8_wo, int4_wo, int4_awq, w8a8_sq or fp8")


def quantized_layout(q: Quantization, prefix: str, out: int, inp: int) -> dict[str, StoredLayout]:
    """Tensor name -> layout of linear PREFIX with a float weight of shape [out, in] (FORMAT.md's table)."""
    q = q.for_linear(prefix)
    kind = weight_kind(q)
    layout: dict[str, StoredLayout] = {}
    if kind == "fp8":
        layout[".weight"] = StoredLayout((ir.DataType.FLOAT8E4M3FN,), (out, inp))
        layout[".weight_scale"] = StoredLayout((F32,), ())
    elif kind == "int8":
        layout[".weight"] = StoredLayout((ir.DataType.INT8,), (out, inp))
        scale_shape = (out,) if q.group_size is None else (out, _blocks(q, prefix, inp))
        layout[".weight_scale"] = StoredLayout(FLOATS, scale_shape)
    else:
        blocks = _blocks(q, prefix, inp)
        packed = ir.DataType.UINT4 if q.zero_point else ir.DataType.INT4
        layout[".weight"] = StoredLayout((ir.DataType.UINT8,), (out, inp // 2), packed, (out, inp))
        layout[".weight_scale"] = StoredLayout(FLOATS, (out, blocks))
        if q.zero_point:
            if blocks % 2:
                # the zeros are packed per row (FORMAT.md); an ONNX UINT4 tensor packs the whole
                # matrix, so with an odd count per row the two only agree when it is even
                raise UnsupportedError(f"{prefix}: {blocks} groups per row with zero points cannot be read as "
                                       f"an ONNX uint4 tensor; convert the float model with --quant int4_awq")
            layout[".weight_zero"] = StoredLayout((ir.DataType.UINT8,), (out, blocks // 2), ir.DataType.UINT4,
                                                  (out, blocks))
        if q.scheme == "gguf":  # Q4_1's per-block offset (FORMAT.md)
            layout[".weight_offset"] = StoredLayout(FLOATS, (out, blocks))
    if q.activation != "none":
        layout[".input_scale"] = StoredLayout((F32,), ())
    return {prefix + suffix: v for suffix, v in layout.items()}


def _blocks(q: Quantization, prefix: str, inp: int) -> int:
    """Scales per row of a blocked linear: its input channels / group_size, which must divide them."""
    g = q.group_size
    if not g or inp % g:
        raise InputError(f"{prefix}: group_size {g} does not divide its {inp} input channels; re-run "
                         f"`trtbuild convert --quant` with a --group-size that divides it")
    return inp // g


def kv_cache_layout(q: Quantization, num_layers: int, kv_heads: int, head_dim: int) -> dict[str, StoredLayout]:
    """The per-channel scales of an int8 KV cache (FORMAT.md): float32 [kv_heads, head_dim] per layer and
    side, read as [1, kv_heads, 1, head_dim] to broadcast over [batch, kv_heads, seq, head_dim]."""
    if q.kv_cache == "none":
        return {}
    if q.kv_cache != "int8":
        raise UnsupportedError(f"config.json asks for a {q.kv_cache} KV cache, which has no graph form; re-run "
                               f"`trtbuild convert` with --kv-cache int8 or none")
    scale = StoredLayout((F32,), (kv_heads, head_dim), None, (1, kv_heads, 1, head_dim))
    return {f"layers.{i}.attn.{side}_cache_scale": scale for i in range(num_layers) for side in ("k", "v")}
