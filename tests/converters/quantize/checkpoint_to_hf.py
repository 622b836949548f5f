"""Test helpers: a (quantized) canonical checkpoint back into a transformers model, to run it as HF does.

Quantized linears are dequantized with rtn / fp8's exact inverses (what the graph computes);
static activation scales become forward pre-hooks that fake-quantize each linear's input.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import torch
import transformers
from safetensors import safe_open

import converters
from converters.quantize import fp8, rtn
from engine_builder.formats import quant_packing
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.formats.model_config import ModelConfig

# canonical linear (without "layers.{i}.") -> the HF modules that read its input
HF_INPUTS = {"attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
             "attn.o": ("self_attn.o_proj",), "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
             "mlp.down": ("mlp.down_proj",)}


def read_checkpoint(ckpt: Path) -> dict[str, np.ndarray]:
    """Every tensor as numpy; F8_E4M3 (which numpy lacks) as its uint8 bytes, BF16 as float32."""
    with safe_open(Path(ckpt) / "rank0.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    as_numpy = {torch.float8_e4m3fn: lambda t: t.view(torch.uint8), torch.bfloat16: lambda t: t.float()}
    return {name: as_numpy.get(t.dtype, lambda t: t)(t).numpy() for name, t in tensors.items()}


def dequantized(ckpt: Path) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """(canonical float tensors with every quantized linear dequantized, linear prefix -> input_scale)."""
    cfg = CheckpointConfig.load(ckpt)
    block = cfg.quantization
    tensors = read_checkpoint(ckpt)
    input_scales = {}
    for prefix in block.quantized:
        q, scale = tensors.pop(f"{prefix}.weight"), tensors.pop(f"{prefix}.weight_scale").astype(np.float32)
        stored = block.for_linear(prefix)  # an int8 lm_head (--lm-head int8) under a 4-bit body
        if stored.scheme == "fp8":
            w = fp8.dequantize_fp8(q, float(scale))
        elif stored.weight_bits == 8:
            w = rtn.dequantize_int8(q, scale)
        elif stored.zero_point:  # ingested awq / gptq: uint4 codes and zeros
            zero = quant_packing.unpack_int4(tensors.pop(f"{prefix}.weight_zero"), scale.shape[1], signed=False)
            w = rtn.dequantize_blocked(quant_packing.unpack_int4(q, q.shape[1] * 2, signed=False), scale, zero)
        else:
            w = rtn.dequantize_blocked(quant_packing.unpack_int4(q, q.shape[1] * 2), scale)
        tensors[f"{prefix}.weight"] = w
        if f"{prefix}.input_scale" in tensors:
            input_scales[prefix] = float(tensors.pop(f"{prefix}.input_scale"))
    return tensors, input_scales


def canonical_to_hf(tensors: dict[str, np.ndarray], model_type: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Canonical tensors -> the HF state dict they came from, fused tensors split by the converter's weight map."""
    weight_map = converters.get_converter(model_type).weight_map
    shapes = expected_shapes(cfg)
    state = {}
    for template, target in weight_map.items():
        if target is None:
            continue
        canonical, part = (target, None) if isinstance(target, str) else target
        for i in range(cfg.num_layers) if "{layer}" in template else [None]:
            name = canonical.replace("{layer}", str(i))
            if name not in tensors:
                continue
            tensor = tensors[name]
            if part is not None:
                rows = shapes[name][1] or (shapes[name][0][0],)
                tensor = np.split(tensor, np.cumsum(rows)[:-1])[part]
            state[template.replace("{layer}", str(i))] = torch.from_numpy(np.ascontiguousarray(tensor, np.float32))
    return state


def hf_model(hf_dir: Path, state: dict[str, torch.Tensor] | None = None,
             input_scales: dict[str, float] | None = None, activation: str = "none"):
    """The HF model of HF_DIR in float32, with STATE loaded and each linear's input fake-quantized
    (int8 or fp8 at input_scales[prefix]) when given."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all("rotary" in m or ("lm_head" in m and model.config.tie_word_embeddings)
                                      for m in missing), (missing, unexpected)
    for prefix, scale in (input_scales or {}).items():
        if prefix == "lm_head":
            modules = [model.lm_head]
        else:
            _, i, part = prefix.split(".", 2)
            modules = [model.model.layers[int(i)].get_submodule(m) for m in HF_INPUTS[part]]
        for module in modules:
            module.register_forward_pre_hook(lambda _, args, s=scale: (fake_quant(args[0], s, activation),))
    return model


def fake_quant(x: torch.Tensor, scale: float, activation: str) -> torch.Tensor:
    """What Q/DQ of a static per-tensor scale does to x: int8 round and clip, or an e4m3 round trip."""
    if activation == "int8":
        return torch.clamp(torch.round(x / scale), -128, 127) * scale  # int8 saturation, as QuantizeLinear
    e4m3 = np.clip(x.numpy() / scale, -fp8.E4M3_MAX, fp8.E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return torch.from_numpy(e4m3.astype(np.float32)) * scale
