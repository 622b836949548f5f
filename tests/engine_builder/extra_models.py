"""Tiny model variants that tests/tiny_models.py lacks, made with the same recipe."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tiny_models import COMMON, TINY_MODELS

# rope variants no tiny model covers; same recipe as tiny_models.make_tiny_model
EXTRA_MODELS: dict[str, tuple[str, str, dict]] = {
    # dynamic NTK only acts beyond max_position_embeddings, so make that short enough to cross
    "llama_dynamic": ("LlamaConfig", "LlamaForCausalLM", dict(
        max_position_embeddings=32, rope_scaling={"rope_type": "dynamic", "factor": 2.0})),
    # o_proj and MLP biases: no tiny model has them
    "llama_biases": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
}
ALL_MODELS = sorted(TINY_MODELS) + sorted(EXTRA_MODELS)


def make_extra_model(name: str, out: Path) -> Path:
    config_cls, model_cls, overrides = EXTRA_MODELS[name]
    config = getattr(transformers, config_cls)(**{**COMMON, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # norms away from 1 (as make_tiny_model) and biases away from 0, so a wrong one shows
        for pname, p in model.named_parameters():
            if "norm" in pname or "bias" in pname:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out
