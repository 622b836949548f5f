"""An int8 KV cache for the tests, with scales measured in Hugging Face transformers, and transformers
running with the same fake-quantized cache as the numeric reference (engine_builder/network/kv_quant.py).

    scales = hf_cache_absmax(hf_dir, prompt) / 127      # {(layer, "k" | "v"): [kv_heads, head_dim]}
    with_int8_kv_cache(float_ckpt, out, scales)          # the checkpoint `convert --kv-cache int8` writes
    hf_greedy_int8_cache(hf_dir, prompt, steps, scales)  # (tokens, logits per step)
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from hf_reference import load_hf
from safetensors.numpy import load_file, save_file

from engine_builder.formats.checkpoint import CheckpointConfig

WEIGHTS = "rank0.safetensors"
Scales = dict[tuple[int, str], np.ndarray]  # (layer, "k" | "v") -> [kv_heads, head_dim] float32


def hf_cache_absmax(hf_dir: Path, prompt: list[int]) -> Scales:
    """Per-channel max |x| of every layer's cached keys (after rotary) and values over PROMPT."""
    model = load_hf(hf_dir)
    with torch.no_grad():
        cache = model(torch.tensor([prompt]), use_cache=True).past_key_values
    scales: Scales = {}
    for i, layer in enumerate(cache.layers):  # keys / values [1, kv_heads, seq, head_dim]
        scales[i, "k"] = layer.keys[0].abs().amax(dim=1).numpy()
        scales[i, "v"] = layer.values[0].abs().amax(dim=1).numpy()
    return scales


def with_int8_kv_cache(src: Path, out: Path, scales: Scales) -> Path:
    """Float checkpoint SRC -> OUT with quantization.kv_cache int8 and the scales FORMAT.md stores."""
    tensors = load_file(Path(src) / WEIGHTS)
    for (i, side), scale in scales.items():
        tensors[f"layers.{i}.attn.{side}_cache_scale"] = np.asarray(scale, np.float32)
    out.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.name not in ("config.json", WEIGHTS):
            shutil.copyfile(f, out / f.name)
    save_file(tensors, str(out / WEIGHTS))
    ckpt = CheckpointConfig.load(src)
    quant = dataclasses.replace(ckpt.quantization, kv_cache="int8")
    (out / "config.json").write_text(dataclasses.replace(ckpt, quantization=quant, num_tensors=len(tensors)).to_json())
    return out


class _FakeQuantCache(transformers.DynamicCache):
    """What an int8 cache keeps: every key/value rounded to its layer's per-channel int8 grid on the way in."""

    def __init__(self, config, scales: Scales):
        super().__init__(config=config)
        self._scales = {k: torch.from_numpy(v)[None, :, None, :] for k, v in scales.items()}  # [1, kvh, 1, hd]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        def fq(x: torch.Tensor, side: str) -> torch.Tensor:
            s = self._scales[layer_idx, side]
            return torch.clamp(torch.round(x / s), -128, 127) * s  # torch.round: half to even, as ONNX Round

        return super().update(fq(key_states, "k"), fq(value_states, "v"), layer_idx, *args, **kwargs)


def hf_greedy_int8_cache(hf_dir: Path, prompt: list[int], steps: int, scales: Scales) \
        -> tuple[list[int], list[np.ndarray]]:
    model = load_hf(hf_dir)
    out = model.generate(torch.tensor([prompt]), past_key_values=_FakeQuantCache(model.config, scales),
                         do_sample=False, max_new_tokens=steps, output_logits=True, return_dict_in_generate=True,
                         pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [step[0].numpy() for step in out.logits]
