"""lower_ort_matmulnbits: quantized linears -> com.microsoft MatMulNBits (onnxruntime only).

    y = MatMul(x, Transpose(DequantizeLinear(W_q [N, K], scale[, zero]), perm=[1, 0]))
 -> y = MatMulNBits(x, B, scales[, zero_points], K, N, bits, block_size, accuracy_level)

B is uint8 [N, K / block, block * bits / 8] with unsigned semantics (zero point 2^(bits-1) when
none is given), the row-major [out, in] bytes of FORMAT.md once their sign is moved:
  int4 (signed, INT4 view)      B = bytes XOR 0x88 (v + 8 in each nibble), scales [N, K/g] as stored
  uint4 + zeros (awq / gptq)    B and zero_points are the stored bytes, referenced where they are
  int8 per channel              B = bytes XOR 0x80, block 32, the row's scale repeated per block
  int8 blocked                  B = bytes XOR 0x80, block g, scales [N, K/g] as stored
New bytes are ir.LazyTensors read from rank0.safetensors with numpy.memmap (onnx_ir refuses
external data in the hard-linked file) only when the graph is saved: network/export.save_graph
streams them into model.onnx.data one at a time, so model.onnx stays small and memory bounded.

Why (onnxruntime 1.31.1 CPU, [1, 576] x [576, 1536], 1 thread): onnxruntime does not fuse the int4
form itself (the Transpose sits between DQ and MatMul: it dequantizes every run, 4.5 ms vs 0.37 ms
for fp32); it fuses the int8 form into MatMulNBits on its own, but at the session's accuracy level.
accuracy_level (the pass's class attribute) is MatMulNBits' compute type: 0 keeps activations in float
(int4: 0.34 ms, as fast as fp32 and exact; int8: 3.1-3.9 ms, ten times slower than fp32, so a float32 int8
linear at level 0 is emitted as two 4-bit MatMulNBits over its high and low nibbles instead, exact), 4
quantizes activations to int8 per block (int4 0.09-0.14 ms, int8 0.04-0.09 ms; ~0.5% error per
matmul). On SmolLM2-135M (float32, batch-1 decode, 2 threads): fp32 46 tok/s; int8_wo 113 at level 4,
5 at level 0; int4 group 64 175 at level 4, 106 at level 0. Level 4 doubles int8_wo's KL from fp32
(0.0032 -> 0.0061, top-1 96.9% either way over 64 steps). We ship 4 for float32 activations;
lower_ort_matmulnbits_exact is the same lowering at level 0, for measurement. float16 activations
always get level 0: at level 4 onnxruntime 1.31's CPU kernel is 16% of the logits' range off the
unfused graph on a tiny llama, int8 and int4 alike (float32 at level 4: 0.7%; float16 at level 0: 0.06%).
So do linears with block offsets (`convert --quant gguf`, network/linear.py): the offsets' share is
computed from the exact activations beside the codes' share, so at level 4 the int8 rounding of a
block's activations is no longer weighted by the weights but by weights minus offset, and the error of
a block adds up instead of cancelling (measured on SmolLM2: eval KL 0.004, but the chat answer to "What
is the capital of France?" turned to French gibberish; level 0 is exact and answers "Paris").
lower_ort_matmulnbits_draft applies level 4 to them as well, for a speculative draft, which need not be
exact (the target verifies every token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from engine_builder.formats import graph_io as io
from passes.base import MS_DOMAIN, OrtContribRewritePass, register_pass

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)  # weights it can re-read as float

ACCURACY_META = io.META_ORT_ACCURACY_LEVEL
INT8_BLOCK = 32  # per-channel int8 has no blocks of its own; 32 is what onnxruntime's own fusion picks


def stored_bytes(tensor: ir.ExternalTensor) -> np.ndarray:
    """The tensor's raw bytes, memory-mapped from its file: uint8 [length]."""
    return np.memmap(Path(tensor.path), np.uint8, mode="r", offset=tensor.offset, shape=(tensor.length,))


def _stored(value: ir.Value | None) -> ir.ExternalTensor | None:
    const = value.const_value if value is not None else None
    return const if isinstance(const, ir.ExternalTensor) else None


def _float_source(scale: ir.Value) -> tuple[ir.ExternalTensor | None, ir.DataType]:
    """A scale as stored, looking through the Cast the emitter adds when the checkpoint's dtype
    differs from the graph's: (stored tensor, its dtype)."""
    node = scale.producer()
    if node is not None and node.op_type == "Cast" and node.domain == "":
        scale = node.inputs[0]
    stored = _stored(scale)
    return stored, stored.dtype if stored is not None else ir.DataType.UNDEFINED


def _lazy(name: str, dtype: ir.DataType, shape: tuple[int, ...], make: Callable[[], np.ndarray]) -> ir.LazyTensor:
    return ir.LazyTensor(lambda: ir.tensor(make(), dtype=dtype), dtype=dtype, shape=ir.Shape(shape), name=name)


def _view(stored: ir.ExternalTensor, name: str, shape: tuple[int, ...]) -> ir.ExternalTensor:
    """The same stored bytes as uint8 of another shape: nothing read or copied."""
    return ir.ExternalTensor(stored.location, stored.offset, stored.length, ir.DataType.UINT8, shape=ir.Shape(shape),
                             name=name, base_dir=stored.base_dir)


class DequantizedMatMul(pattern.RewriteRuleClassBase):
    def __init__(self, accuracy_level: int, offsets_too: bool = False):
        super().__init__(f"DequantizedMatMul_level{accuracy_level}{'_offsets' if offsets_too else ''}")
        self.accuracy_level = accuracy_level
        self.offsets_too = offsets_too  # the level applies to linears with block offsets as well

    def pattern(self, op, x, w, scale):
        weight = op.DequantizeLinear(w, scale, _allow_other_inputs=True, _allow_other_attributes=True,
                                     _outputs=["weight"])  # [N, K]
        return op.MatMul(x, op.Transpose(weight, perm=[1, 0]))

    def check(self, context, x, w, scale, weight, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        dq = weight.producer()
        stored = _stored(w)
        if stored is None or len(stored.shape) != 2:
            return result.fail("the dequantized weight is not a 2-D tensor stored in the checkpoint", w)
        if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
            return result.fail(f"activations are {x.dtype}; MatMulNBits takes float32 or float16", x)
        source, source_dtype = _float_source(scale)
        if source is None or source_dtype not in _FLOATS:
            return result.fail("the scale is not a float tensor stored in the checkpoint", scale)
        n, k = stored.shape
        axis, block = dq.attributes.get_int("axis", 1), dq.attributes.get_int("block_size", 0)
        zero = dq.inputs[2] if len(dq.inputs) > 2 else None
        if stored.dtype == ir.DataType.INT8 and not block:
            if axis != 0 or zero is not None or tuple(scale.shape or ()) != (n,):
                return result.fail("int8 weight is not dequantized per output channel (axis 0, no zero point)", w)
            if k % INT8_BLOCK:
                return result.fail(f"int8 weight's {k} input channels are not a multiple of {INT8_BLOCK}", w)
        elif stored.dtype in (ir.DataType.INT8, ir.DataType.INT4, ir.DataType.UINT4):
            if axis != 1 or block < 16 or block & (block - 1) or k % block:
                return result.fail(f"{stored.dtype} weight is not blocked along its input axis by a power of two "
                                   f">= 16 dividing K (axis {axis}, block_size {block})", w)
            if stored.dtype == ir.DataType.INT8 and zero is not None:
                return result.fail("blocked int8 weight has a zero point; MatMulNBits' 8-bit form takes none", w)
            has_zero = zero is not None
            if (stored.dtype == ir.DataType.UINT4) != has_zero or (has_zero and _stored(zero) is None):
                return result.fail("int4 zero points are not a stored uint4 tensor beside a uint4 weight", w)
        else:
            return result.fail(f"weight type {stored.dtype} has no MatMulNBits form", w)
        return result

    def rewrite(self, op, x, w, scale, weight, **_):
        dq = weight.producer()
        stored: ir.ExternalTensor = w.const_value
        source, source_dtype = _float_source(scale)
        n, k = stored.shape
        dtype = x.dtype  # scales must be in the activation type
        name = w.name.removesuffix(".weight") + ".nbits"
        block = dq.attributes.get_int("block_size", 0)
        if stored.dtype == ir.DataType.INT8:
            bits, per_channel = 8, not block
            block = block or INT8_BLOCK
            b = _lazy(f"{name}.B", ir.DataType.UINT8, (n, k // block, block),
                      lambda: (stored_bytes(stored) ^ 0x80).reshape(n, k // block, block))
        else:
            bits, per_channel = 4, False
            shape = (n, k // block, block // 2)
            if stored.dtype == ir.DataType.INT4:  # signed nibbles -> unsigned with zero point 8
                b = _lazy(f"{name}.B", ir.DataType.UINT8, shape, lambda: (stored_bytes(stored) ^ 0x88).reshape(shape))
            else:
                b = _view(stored, f"{name}.B", shape)

        def scale_array() -> np.ndarray:  # [N, K / block] in the activations' type
            read = _read_float(source, source_dtype, dtype)
            return np.repeat(read.reshape(n, 1), k // block, axis=1) if per_channel else read.reshape(n, k // block)

        if per_channel:  # the row's scale repeated per block
            scales = _lazy(f"{name}.scales", dtype, (n, k // block), scale_array)
        else:
            scales = (source if source_dtype == dtype and source.shape == (n, k // block) else
                      _lazy(f"{name}.scales", dtype, (n, k // block), scale_array))
        inputs = [x, op.initializer(b, b.name), op.initializer(scales, scales.name) if scales is not source else scale]
        if stored.dtype == ir.DataType.UINT4:
            zero: ir.ExternalTensor = dq.inputs[2].const_value  # packed per row, as MatMulNBits wants
            zero_view = _view(zero, f"{name}.zero_points", (n, zero.length // n))
            inputs.append(op.initializer(zero_view, zero_view.name))
        # see the module docstring for both exceptions
        offsets = w.graph is not None and w.name.removesuffix(".weight") + ".weight_offset" in w.graph.initializers
        level = self.accuracy_level if dtype == ir.DataType.FLOAT and (self.offsets_too or not offsets) else 0
        if bits == 8 and level == 0 and dtype == ir.DataType.FLOAT:
            return _nibble_pair(op, x, stored, inputs[2], scale_array, n, k, block, name)
        return op.MatMulNBits(*inputs, _domain=MS_DOMAIN, K=k, N=n, bits=bits, block_size=block,
                              accuracy_level=level)


def _nibble_pair(op, x: ir.Value, stored: ir.ExternalTensor, scale_input: ir.Value,
                 scale_array: Callable[[], np.ndarray], n: int, k: int, block: int, name: str) -> ir.Value:
    """An int8 linear at float activations as two 4-bit MatMulNBits at level 0, exactly: with u = q + 128 =
    16 h + l (nibbles h, l), d q = 16 d (h - 8) + d l. onnxruntime's 8-bit kernel at level 0 dequantizes the
    whole matrix every call (SmolLM2's [576, 49152] head: 120-208 ms), its 4-bit one does not: the pair takes
    2.3 ms where the float32 head takes 4.0 (2 threads, quiet 2-core EPYC; benchmarks/int8_exact_head.py)."""
    blocks, shape = k // block, (n, k // block, block // 2)

    def nibbles(shift: int) -> np.ndarray:
        v = (((stored_bytes(stored) ^ 0x80) >> shift) & 15).reshape(n, blocks, block // 2, 2)
        return (v[..., 0] | (v[..., 1] << 4)).astype(np.uint8)

    def zero_points(z: int) -> ir.LazyTensor:  # one nibble per block, packed per row
        return _lazy(f"{name}.zero_points{z}", ir.DataType.UINT8, (n, (blocks + 1) // 2),
                     lambda: np.full((n, (blocks + 1) // 2), z * 0x11, np.uint8))

    high, low = (_lazy(f"{name}.B_{part}", ir.DataType.UINT8, shape, lambda s=shift: nibbles(s))
                 for part, shift in (("high", 4), ("low", 0)))
    scales16 = _lazy(f"{name}.scales16", ir.DataType.FLOAT, (n, blocks),
                     lambda: scale_array() * np.float32(16))
    outs = [op.MatMulNBits(x, op.initializer(b, b.name), scale, op.initializer(z, z.name), _domain=MS_DOMAIN, K=k,
                           N=n, bits=4, block_size=block, accuracy_level=0)
            for b, scale, z in ((high, op.initializer(scales16, scales16.name), zero_points(8)),
                                (low, scale_input, zero_points(0)))]
    return op.Add(*outs)


def _read_float(stored: ir.ExternalTensor, stored_dtype: ir.DataType, dtype: ir.DataType) -> np.ndarray:
    return stored_bytes(stored).view(stored_dtype.numpy()).astype(dtype.numpy())


@register_pass
class LowerOrtMatMulNBits(OrtContribRewritePass):
    name = "lower_ort_matmulnbits"
    description = "DequantizeLinear -> Transpose -> MatMul (int4 / int8 weights) -> com.microsoft MatMulNBits"
    accuracy_level: ClassVar[int] = 4
    offsets_too: ClassVar[bool] = False  # lower_ort_matmulnbits_draft: level 4 for block offsets as well

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [DequantizedMatMul.rule(self.accuracy_level, self.offsets_too)]

    def apply(self, model: ir.Model) -> int:
        count = super().apply(model)
        if count:
            levels = {node.attributes.get_int("accuracy_level", 0) for node in model.graph
                      if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN}
            model.metadata_props[ACCURACY_META] = ",".join(map(str, sorted(levels)))
        return count

    def why_not(self, model: ir.Model) -> str | None:
        if not any(node.op_type == "DequantizeLinear" for node in model.graph):
            return "no DequantizeLinear in the graph: the checkpoint has no quantized linears"
        return super().why_not(model)

