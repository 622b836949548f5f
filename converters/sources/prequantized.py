"""Pre-quantized Hugging Face checkpoints (AutoAWQ GEMM, GPTQ) ingested as FORMAT.md's awq / gptq rows.

The integer codes, zeros and scales are only unpacked and re-laid out, never re-quantized, so
the canonical checkpoint dequantizes to exactly the weights the source does. Source layouts,
for a linear M with weight [out, in] and group size g (int32 words hold 8 nibbles, low first):

    AutoAWQ GEMM  M.qweight [in, out/8]    word c of row k: nibble i is column 8c + AWQ_ORDER[i]
                  M.qzeros  [in/g, out/8]  the same interleaved order
                  M.scales  [in/g, out]    w = (q - zero) * scale
    GPTQ          M.qweight [in/8, out]    word r of column o: nibble j is input row 8r + j
                  M.qzeros  [in/g, out/8]  nibble j is column 8c + j; checkpoint_format "gptq"
                                           (the classic one) stores zero - 1, "gptq_v2" the zero
                  M.scales  [in/g, out], M.g_idx [in] (the group of each input row)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from converters.registry import PlannedTensor, TensorInfo
from engine_builder.formats.checkpoint import linear_prefixes
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quant_packing import FLOAT_DTYPES, pack_int4
from engine_builder.formats.quantization import Quantization
from engine_builder.util.errors import InputError, UnsupportedError

if TYPE_CHECKING:
    from converters.safetensors_writer import StreamingSafetensorsWriter
    from converters.sources.source import Source

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PACKED = ("qweight", "qzeros", "scales", "g_idx")
WEIGHT_DTYPE = "prequantized"  # TensorInfo dtype of the [out, in] weight a packed linear stands for
_SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)  # the 8 nibbles of an int32 word, low first
_ALTERNATIVE = "convert the unquantized model with --quant int4_awq instead"


@dataclass(frozen=True)
class PrequantizedFormat:
    method: str  # "awq" | "gptq"
    group_size: int
    zero_offset: int  # added to stored zeros: 1 for classic GPTQ, which stores zero - 1


def detect(hf_config: dict[str, Any]) -> PrequantizedFormat | None:
    """The pre-quantized format config.json declares, None for a float checkpoint; unsupported variants raise."""
    qc = hf_config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method not in ("awq", "gptq"):
        raise UnsupportedError(f"quantization_config.quant_method {method!r} is not supported; trtbuild ingests "
                               f"awq (AutoAWQ GEMM) and gptq (desc_act false) checkpoints, or {_ALTERNATIVE}")
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise UnsupportedError(f"{method} checkpoint has bits {bits}; trtbuild ingests 4-bit {method} only, "
                               f"or {_ALTERNATIVE}")
    group_size = qc.get("group_size", qc.get("q_group_size"))
    if not isinstance(group_size, int) or group_size <= 0:
        raise UnsupportedError(f"{method} checkpoint has group_size {group_size}; trtbuild ingests grouped "
                               f"checkpoints only (a positive group_size such as 128), or {_ALTERNATIVE}")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise UnsupportedError(f"AWQ version {version!r} is not supported; trtbuild ingests AutoAWQ's gemm "
                                   f"layout: re-export with version='gemm', or {_ALTERNATIVE}")
        if not qc.get("zero_point", True):
            raise UnsupportedError(f"AWQ checkpoint without zero points is not supported; trtbuild ingests "
                                   f"zero_point true, or {_ALTERNATIVE}")
        return PrequantizedFormat("awq", group_size, 0)
    if qc.get("desc_act"):
        raise UnsupportedError("GPTQ checkpoint uses act-order (desc_act true), whose groups are permuted; "
                               f"trtbuild ingests desc_act false: re-quantize with desc_act=False, or {_ALTERNATIVE}")
    checkpoint_format = str(qc.get("checkpoint_format", "gptq")).lower()
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise UnsupportedError(f"GPTQ checkpoint_format {checkpoint_format!r} is not supported; trtbuild "
                               f"ingests gptq and gptq_v2, or {_ALTERNATIVE}")
    return PrequantizedFormat("gptq", group_size, 1 if checkpoint_format == "gptq" else 0)


def weight_infos(infos: dict[str, TensorInfo], fmt: PrequantizedFormat) -> dict[str, TensorInfo]:
    """Source tensor infos with each packed linear's tensors replaced by the [out, in] weight they encode,
    so the architecture's weight map and shape checks apply to it unchanged."""
    modules = sorted({name.removesuffix(".qweight") for name in infos if name.endswith(".qweight")})
    result = {name: info for name, info in infos.items() if name.rsplit(".", 1)[-1] not in PACKED}
    for m in modules:
        missing = [f"{m}.{part}" for part in ("qzeros", "scales") if f"{m}.{part}" not in infos]
        if missing:
            raise InputError(f"{fmt.method} checkpoint has {m}.qweight but no {', '.join(missing)}; it is "
                             f"incomplete or a shard is missing")
        packed = infos[f"{m}.qweight"].shape
        out, inp = (packed[1] * 8, packed[0]) if fmt.method == "awq" else (packed[1], packed[0] * 8)
        if inp % fmt.group_size:
            raise InputError(f"{m} has {inp} input channels, not a multiple of group_size {fmt.group_size}; "
                             f"the checkpoint and its quantization_config disagree")
        blocks = inp // fmt.group_size
        for part, want in (("qzeros", (blocks, out // 8)), ("scales", (blocks, out))):
            if infos[f"{m}.{part}"].shape != want:
                raise InputError(f"{m}.{part} has shape {list(infos[f'{m}.{part}'].shape)}, expected {list(want)} "
                                 f"for a {fmt.method} linear of [{out}, {inp}] with group_size {fmt.group_size}")
        result[f"{m}.weight"] = TensorInfo((out, inp), WEIGHT_DTYPE)
    return result


def _nibbles(words: np.ndarray) -> np.ndarray:
    """int32 [..., n] -> uint8 [..., n, 8], the low nibble first."""
    return ((words.view(np.uint32)[..., None] >> _SHIFTS) & 0xF).astype(np.uint8)


def unpack(source: Source, module: str, fmt: PrequantizedFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear `module` -> (q uint8 0..15 [out, in], zero uint8 0..15 [out, in/g], scale float32 [out, in/g])."""
    qweight = source.load(f"{module}.qweight").numpy()
    qzeros = source.load(f"{module}.qzeros").numpy()
    scale = source.load(f"{module}.scales").float().numpy().T  # [out, blocks]
    if fmt.method == "awq":
        order = np.argsort(AWQ_ORDER)  # column 8c + j is nibble order[j]
        q = _nibbles(qweight)[..., order].reshape(qweight.shape[0], -1).T  # [in, out/8, 8] -> [out, in]
        zero = _nibbles(qzeros)[..., order].reshape(qzeros.shape[0], -1).T  # [out, blocks]
    else:
        words = qweight.shape[0]
        q = _nibbles(qweight).transpose(0, 2, 1).reshape(words * 8, -1).T  # [in/8, out, 8] -> [out, in]
        zero = ((_nibbles(qzeros).reshape(qzeros.shape[0], -1) + fmt.zero_offset) & 0xF).T  # [out, blocks]
        _check_g_idx(source, module, q.shape[1], fmt.group_size)
    return np.ascontiguousarray(q), np.ascontiguousarray(zero), np.ascontiguousarray(scale, np.float32)


def _check_g_idx(source: Source, module: str, inp: int, group_size: int) -> None:
    """desc_act false means input row k is in group k // g; a permuted g_idx is act-order, whatever the config says."""
    if f"{module}.g_idx" not in source.tensor_infos():
        return
    g_idx = source.load(f"{module}.g_idx").numpy()
    if not np.array_equal(g_idx, np.arange(inp) // group_size):
        raise UnsupportedError(f"{module}.g_idx is not k // group_size: the checkpoint is act-order (desc_act) "
                               f"whatever its config says; re-quantize with desc_act=False, or {_ALTERNATIVE}")


def quantization_block(source: Source, model: ModelConfig, tensors: tuple[PlannedTensor, ...],
                       infos: dict[str, TensorInfo], fmt: PrequantizedFormat) -> Quantization:
    """config.json's quantization block: the linears stored packed, and whether their zeros are all 8."""
    planned = {t.name: t for t in tensors}
    packed, kept = [], []
    for p in linear_prefixes(model):
        if f"{p}.weight" not in planned:  # a tied lm_head
            continue
        kinds = {infos[s].dtype == WEIGHT_DTYPE for s in planned[f"{p}.weight"].sources}
        if len(kinds) > 1:
            raise UnsupportedError(f"{p} fuses packed and float parts ({', '.join(planned[f'{p}.weight'].sources)}); "
                                   f"trtbuild needs the parts of a fused linear quantized alike")
        (packed if kinds == {True} else kept).append(p)
    modules = [s.removesuffix(".weight") for p in packed for s in planned[f"{p}.weight"].sources]
    return Quantization(scheme=fmt.method, weight_bits=4, group_size=fmt.group_size,
                        zero_point=not _symmetric(source, modules, fmt), quantized=tuple(packed), excluded=tuple(kept))


def _symmetric(source: Source, modules: list[str], fmt: PrequantizedFormat) -> bool:
    """True when every zero of a GPTQ checkpoint is 8: then q - 8 is plain signed int4 (-8..7) and no
    zeros need storing, which TensorRT accepts (it refuses int4 zero points). Zeros are small:
    [in/g, out/8] words per linear."""
    if fmt.method != "gptq":
        return False
    for m in modules:
        zero = (_nibbles(source.load(f"{m}.qzeros").numpy()) + fmt.zero_offset) & 0xF
        if not (zero == 8).all():
            return False
    return True


def linear_layout(t: PlannedTensor, dtype: str, group_size: int, sym: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    """The tensors of planned weight `t` ([out, in], its parts packed linears), FORMAT.md's awq / gptq row."""
    prefix = t.name.removesuffix(".weight")
    out, inp = t.shape
    blocks = inp // group_size
    layout = [(t.name, "uint8", (out, inp // 2)), (f"{prefix}.weight_scale", dtype, (out, blocks))]
    if not sym:
        layout.append((f"{prefix}.weight_zero", "uint8", (out, (blocks + 1) // 2)))
    return layout


def append_linear(source: Source, writer: StreamingSafetensorsWriter, t: PlannedTensor, fmt: PrequantizedFormat,
                  dtype: str, sym: bool) -> None:
    """Write planned weight `t`: its parts' codes, then scales, then zeros, each fused by rows."""
    parts = [unpack(source, name.removesuffix(".weight"), fmt) for name in t.sources]
    prefix = t.name.removesuffix(".weight")
    for q, _, _ in parts:
        writer.append(t.name, pack_int4(q.astype(np.int8) - 8 if sym else q))  # [rows, in/2]
    for _, _, scale in parts:
        writer.append(f"{prefix}.weight_scale", scale.astype(FLOAT_DTYPES[dtype]))  # [rows, blocks]
    if not sym:
        for _, zero, _ in parts:
            writer.append(f"{prefix}.weight_zero", pack_int4(zero))  # [rows, ceil(blocks/2)]
