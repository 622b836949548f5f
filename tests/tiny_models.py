"""Tiny random Hugging Face models, one per architecture, made in code (never downloaded).

2 layers (4 where the attention pattern needs it), small dims, and the features that make
each architecture different switched on: biases, q/k norms, sliding windows, soft-capping,
partial rotary, rope scaling.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name -> (config class, model class, config overrides)
TINY_MODELS: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rope_theta=500000.0)),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True, head_dim=32)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        use_sliding_window=True, sliding_window=8, max_window_layers=1,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True,
                                                      rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.5, original_max_position_embeddings=64,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 8 for i in range(4)],
                      "long_factor": [2.0 + i / 4 for i in range(4)]})),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=16, sliding_window=8, query_pre_attn_scalar=24, num_hidden_layers=4,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, sliding_window=8, query_pre_attn_scalar=16, num_hidden_layers=4,
        sliding_window_pattern=2, rope_scaling={"rope_type": "linear", "factor": 4.0},
        rope_local_base_freq=10000.0, rope_theta=1000000.0)),
}


# Families whose configs name their dims their own way (not COMMON's), with LayerNorm and biases. Not in
# TINY_MODELS: every test parametrized over that table would build them (several TensorRT-RTX builds
# each); tests/converters/test_gpt_families.py runs them through convert, build and generate once.
# Weights at 10x transformers' init scale, as tests/toy_arch does, so greedy decoding does not settle
# on one repeated token and a wrong layout changes the tokens.
FAMILY_MODELS: dict[str, tuple[str, str, dict]] = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=128, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    # partial rotary (half of each head), parallel residual, untied embed_out
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256, rotary_pct=0.5, use_parallel_residual=True, initializer_range=0.2,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}


# mixture-of-experts families: 8 experts, top-2, qwen2_moe's shared expert and gate, norm_topk_prob on for
# qwen3_moe (off for qwen2_moe, as its released models have it); make them with spread_routers applied
MOE = dict(num_experts_per_tok=2, initializer_range=0.1)
MOE_MODELS: dict[str, tuple[str, str, dict]] = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(**MOE, num_local_experts=8, intermediate_size=48)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        **MOE, num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        **MOE, num_experts=8, moe_intermediate_size=32, head_dim=16, norm_topk_prob=True)),
}


def spread_routers(model: torch.nn.Module) -> None:
    """Norms moved off 1 and router weights spread (qwen's init is zeros: every expert tied, TopK's tie-break
    would decide), so a wrong router or norm changes the tokens."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                p.copy_(torch.randn_like(p))


def make_tiny_model(name: str, out: Path, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    """Save a tiny random model `name` (a TINY_MODELS or FAMILY_MODELS key) as an HF dir under `out`."""
    family = name in FAMILY_MODELS
    config_cls, model_cls, overrides = FAMILY_MODELS[name] if family else TINY_MODELS[name]
    config = getattr(transformers, config_cls)(**(overrides if family else {**COMMON, **overrides}))
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(dtype).eval()
    # random init leaves norms at exactly 1 (or 0 for gemma), and a family's biases at 0: perturb them
    # so a wrong norm or bias shows
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or (family and (".ln_" in pname or pname.endswith("bias"))):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    return out
