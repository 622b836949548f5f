"""A checkpoint's or engine dir's tensors for the torch decoder: read lazily, checked, dequantized.

    read_model_dir   config.json (a checkpoint's, or an engine dir's manifest) + rank0.safetensors, opened
                     lazily: a tensor is read when the decoder takes it, so host memory holds one at a time;
                     of a tp dir, one rank's shard (rank{r}.safetensors) and the config of what it holds
    float_weight     a canonical float tensor, or a quantized linear's weight dequantized to float32 per
                     converters/quantize/FORMAT.md (weight-only schemes: correct, not fast)

Activation-quantized schemes (w8a8_sq, fp8) and the int8 KV cache are refused: the decoder runs float
activations into a float KV pool. This reads formats/ only (no onnx_ir, which quant_layout.py brings): the
runtime loads nothing of the graph tooling.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine_builder.formats.checkpoint import CHECKPOINT_SCHEMA, CONFIG_FILE, CheckpointConfig, weights_file
from engine_builder.formats.manifest import ENGINE_SCHEMA, EngineManifest
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.formats.quant_packing import unpack_int4
from engine_builder.formats.quantization import Quantization
from engine_builder.util.errors import InputError, UnsupportedError

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_NO_QUANT = "convert the float model without --quant for the torch backend"


@dataclass(frozen=True)
class ModelDir:
    """What a dir holds for the torch decoder."""

    model: ModelConfig  # of a tp dir's rank: what its shard holds (mapping.local_model)
    quantization: Quantization
    tensors: Mapping[str, torch.Tensor]  # canonical name -> tensor as stored, read on access
    max_seq_len: int | None  # an engine dir's limit (its rotary tables' bound); None for a checkpoint dir


class LazySafetensors(Mapping[str, torch.Tensor]):
    """rank0.safetensors as a read-only mapping; each lookup reads that tensor (on the CPU) from the file."""

    def __init__(self, path: Path):
        if not path.is_file():
            raise InputError(f"{path.parent} has no {path.name}; re-run `trtbuild convert` (or `trtbuild build`)")
        try:
            self._file = safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError for a bad header
            raise InputError(f"{path} is not a readable safetensors file ({exc}); re-run `trtbuild convert`") \
                from exc
        self._names = tuple(self._file.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self._file.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def read_model_dir(path: Path, tp_rank: int | None = None) -> ModelDir:
    """A checkpoint dir (`trtbuild convert`) or an engine dir (`trtbuild build`), told apart by config.json's schema.
    TP_RANK: of a tensor-parallel dir (`convert --tp N`), the rank whose shard to read."""
    path = Path(path)
    try:
        schema = json.loads((path / CONFIG_FILE).read_text()).get("schema")
    except (OSError, ValueError, AttributeError):
        schema = None
    if schema == ENGINE_SCHEMA:
        manifest = EngineManifest.load(path)
        if manifest.model is None:
            raise UnsupportedError(f"{path} was built from an ONNX file (`build --onnx`): it has no checkpoint "
                                   "weights for the torch backend; build it from a checkpoint dir")
        model, quantization, mapping = manifest.model, manifest.checkpoint_quantization, manifest.mapping
        max_seq_len: int | None = manifest.build.limits.max_seq_len
    else:
        if schema != CHECKPOINT_SCHEMA:
            raise InputError(f"{path} is neither a checkpoint dir (`trtbuild convert`) nor an engine dir "
                             "(`trtbuild build`): its config.json is missing or of another schema")
        ckpt = CheckpointConfig.load(path)
        model, quantization, mapping, max_seq_len = ckpt.model, ckpt.quantization, ckpt.mapping, None
    model.validate()
    rank = 0
    if mapping is not None and mapping != ParallelMapping(1, 1):
        if mapping.pp != 1:
            raise UnsupportedError(f"{path} is split into {mapping.pp} pipeline stages (pp {mapping.pp}); the torch "
                                   "backend runs tensor parallel only (tp, pp=1): convert with --tp alone, or run "
                                   "it with --backend onnxruntime")
        if tp_rank is None or not 0 <= tp_rank < mapping.tp:
            raise UnsupportedError(f"{path} is sharded for tp {mapping.tp}: each of its {mapping.tp} ranks reads its "
                                   "own shard; run it with `trtbuild run` (which starts the ranks) or under torchrun")
        mapping.check(model)
        model, rank = mapping.local_model(model), tp_rank
    elif tp_rank:
        raise UnsupportedError(f"{path} is not sharded for tensor parallel (no --tp at convert): it has no rank "
                               f"{tp_rank}")
    return ModelDir(model, quantization, LazySafetensors(path / weights_file(rank)), max_seq_len)


def check_quantization(q: Quantization) -> None:
    """Refuse what the torch decoder cannot compute, before any tensor is read."""
    if q.kv_cache != "none":
        raise UnsupportedError(f"the checkpoint has a {q.kv_cache} KV cache (--kv-cache {q.kv_cache}), which the "
                               "torch backend does not implement; convert without --kv-cache for the torch backend")
    if q.scheme == "none" or not q.quantized:
        return
    if q.activation != "none" or q.weight_bits not in (4, 8):
        raise UnsupportedError(f"the checkpoint is quantized with {q.scheme} (activation quantization or fp8), "
                               f"which the torch backend does not dequantize; {_NO_QUANT} (or with int8_wo / "
                               "int4_wo, which it dequantizes at load)")


def float_weight(tensors: Mapping[str, torch.Tensor], q: Quantization, prefix: str, shape: tuple[int, ...],
                 device: torch.device | str) -> torch.Tensor:
    """Linear PREFIX's weight [out, in] on DEVICE: as stored when float, else dequantized to float32 (FORMAT.md)."""
    if prefix not in q.quantized:
        return expect(tensors, prefix + ".weight", shape, device)
    q = q.for_linear(prefix)  # an int8 lm_head under an int4 body reads as int8_wo
    out, inp = shape
    weight, scale = _stored(tensors, prefix + ".weight", device), _stored(tensors, prefix + ".weight_scale", device)
    if q.weight_bits == 8:
        _check(prefix + ".weight", weight, (out, inp), (torch.int8,))
        codes = weight.float()  # [out, in]
    else:
        _check(prefix + ".weight", weight, (out, inp // 2), (torch.uint8,))
        codes = _unpack_int4(weight, inp, signed=not q.zero_point)
    if q.group_size is None:  # int8 per output channel: w = q * scale[o]
        _check(prefix + ".weight_scale", scale, (out,), FLOAT_DTYPES)
        return codes * scale.float()[:, None]
    g = q.group_size
    if inp % g:
        raise InputError(f"{prefix}: group_size {g} does not divide its {inp} input channels; re-run "
                         "`trtbuild convert --quant`")
    blocks = inp // g
    _check(prefix + ".weight_scale", scale, (out, blocks), FLOAT_DTYPES)
    codes = codes.view(out, blocks, g)
    if q.zero_point:  # w = (q - zero) * scale, zeros packed per row
        zero = _stored(tensors, prefix + ".weight_zero", device)
        _check(prefix + ".weight_zero", zero, (out, -(-blocks // 2)), (torch.uint8,))
        codes = codes - _unpack_int4(zero, blocks, signed=False)[:, :, None]
    w = codes * scale.float()[:, :, None]
    if q.scheme == "gguf":  # Q4_1 / Q4_K blocks: w = q * scale + offset
        offset = _stored(tensors, prefix + ".weight_offset", device)
        _check(prefix + ".weight_offset", offset, (out, blocks), FLOAT_DTYPES)
        w = w + offset.float()[:, :, None]
    return w.reshape(out, inp)


def _unpack_int4(packed: torch.Tensor, n: int, signed: bool) -> torch.Tensor:
    """formats/quant_packing.py's unpacking (at load, on the host) -> float32 [rows, n] on packed's device."""
    return torch.from_numpy(unpack_int4(packed.cpu().numpy(), n, signed)).to(packed.device).float()


def expect(tensors: Mapping[str, torch.Tensor], name: str, shape: tuple[int, ...],
           device: torch.device | str) -> torch.Tensor:
    """Float tensor NAME of SHAPE, on DEVICE in its stored dtype, or an InputError naming the fix."""
    t = _stored(tensors, name, device)
    _check(name, t, shape, FLOAT_DTYPES)
    return t


def _stored(tensors: Mapping[str, torch.Tensor], name: str, device: torch.device | str) -> torch.Tensor:
    if name not in tensors:
        raise InputError(f"the checkpoint has no tensor {name!r} that its config.json requires; "
                         "re-run `trtbuild convert`")
    return tensors[name].to(device)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise InputError(f"{name!r} has shape {list(t.shape)} but config.json implies {list(shape)}; "
                         "re-run `trtbuild convert`")
    if t.dtype not in dtypes:
        raise InputError(f"{name!r} is {t.dtype} but config.json implies {' or '.join(map(str, dtypes))}; "
                         "re-run `trtbuild convert`")
