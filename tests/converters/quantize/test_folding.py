"""Folding input scales leaves the float model's function unchanged: transformers runs the folded weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from checkpoint_to_hf import canonical_to_hf, hf_model, read_checkpoint

from converters.convert import convert
from converters.quantize.folding import Folding, foldable
from engine_builder.formats.checkpoint import CheckpointConfig


def logits(model, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(ids).logits.numpy()


@pytest.fixture
def mha_llama(tmp_path):
    """A tiny llama with as many kv heads as heads, so o's scale folds into the v rows of qkv too."""
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, attention_bias=True,
                                      mlp_bias=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # random init leaves biases at 0 and norms at 1, which no wrong fold would disturb
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


@pytest.mark.parametrize("arch", ["mha_llama", "llama", "gemma2"])
def test_folded_float_model_computes_the_same_logits(arch, mha_llama, tiny_model_dir, tmp_path):
    hf_dir = mha_llama if arch == "mha_llama" else tiny_model_dir(arch)
    convert(hf_dir, tmp_path / "ckpt", dtype="float32")
    cfg = CheckpointConfig.load(tmp_path / "ckpt").model
    tensors = read_checkpoint(tmp_path / "ckpt")
    # scales far from 1 (0.2..5), so a fold into the wrong op, rows or norm formula shows in the logits
    rng = np.random.default_rng(1)
    in_features = {"attn.qkv": cfg.hidden_size, "mlp.gate_up": cfg.hidden_size, "attn.o": cfg.q_dim,
                   "mlp.down": cfg.intermediate_size}
    scales = {p: np.exp(rng.uniform(-1.6, 1.6, in_features[p.split(".", 2)[2]])).astype(np.float32)
              for p in foldable(cfg)}
    assert len(scales) == cfg.num_layers * (4 if arch == "mha_llama" else 3)  # o folds only without GQA
    folding = Folding(cfg, scales)
    folded = {name: folding.apply(name, t) if folding.touches(name) else t for name, t in tensors.items()}
    changed = {name for name in tensors if not np.array_equal(folded[name], tensors[name])}
    expected = {f"layers.{i}.{t}" for i in range(cfg.num_layers)
                for t in ("attn_norm.weight", "mlp_norm.weight", "attn.qkv.weight", "mlp.gate_up.weight",
                          "mlp.down.weight")}
    if arch == "mha_llama":
        expected |= {f"layers.{i}.{t}" for i in range(cfg.num_layers)
                     for t in ("attn.o.weight", "attn.qkv.bias", "mlp.gate_up.bias")}
    assert changed == expected

    ids = torch.from_numpy(np.random.default_rng(2).integers(3, cfg.vocab_size, (2, 12)))
    model_type = "llama" if arch == "mha_llama" else transformers.AutoConfig.from_pretrained(hf_dir).model_type
    reference = logits(hf_model(hf_dir), ids)
    np.testing.assert_array_equal(logits(hf_model(hf_dir, canonical_to_hf(tensors, model_type, cfg)), ids),
                                  reference)  # the mapping back to HF is exact
    got = logits(hf_model(hf_dir, canonical_to_hf(folded, model_type, cfg)), ids)
    # float32 reassociation only: (x / s) (W s) rounds differently from x W
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
