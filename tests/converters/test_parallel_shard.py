"""`convert --tp/--pp`: each rank's file holds exactly its Megatron shard of the HF tensors, and mappings the
model cannot divide are refused with the valid values listed."""

from __future__ import annotations

import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from safetensors.torch import load_file

from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.parallel_mapping import ParallelMapping
from engine_builder.util.errors import InputError, UnsupportedError


def test_tp4_shards_by_megatron_rules_and_replicates_kv_heads(tiny_model_dir, tmp_path):
    """Tiny llama: 4 heads, 2 KV heads (so at tp=4 each KV head lives on 2 ranks), head_dim 16,
    intermediate 96, vocab 320, untied lm_head."""
    hf_dir = tiny_model_dir("llama")
    convert(hf_dir, tmp_path / "ckpt", dtype="float32", tp=4)
    assert CheckpointConfig.load(tmp_path / "ckpt").mapping == ParallelMapping(tp=4, pp=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).state_dict()
    hd = 16
    for rank in range(4):
        t = load_file(tmp_path / "ckpt" / f"rank{rank}.safetensors")
        p = "model.layers.1."
        q, k, v = t["layers.1.attn.qkv.weight"].split([hd, hd, hd])  # one query head, one KV head each
        assert torch.equal(q, hf[p + "self_attn.q_proj.weight"][rank * hd:(rank + 1) * hd])
        kv = rank // 2  # query heads 0, 1 read KV head 0; 2, 3 read KV head 1
        assert torch.equal(k, hf[p + "self_attn.k_proj.weight"][kv * hd:(kv + 1) * hd])
        assert torch.equal(v, hf[p + "self_attn.v_proj.weight"][kv * hd:(kv + 1) * hd])
        assert torch.equal(t["layers.1.attn.o.weight"], hf[p + "self_attn.o_proj.weight"][:, rank * hd:(rank + 1) * hd])
        gate, up = t["layers.1.mlp.gate_up.weight"].split([24, 24])
        assert torch.equal(gate, hf[p + "mlp.gate_proj.weight"][rank * 24:(rank + 1) * 24])
        assert torch.equal(up, hf[p + "mlp.up_proj.weight"][rank * 24:(rank + 1) * 24])
        assert torch.equal(t["layers.1.mlp.down.weight"], hf[p + "mlp.down_proj.weight"][:, rank * 24:(rank + 1) * 24])
        assert torch.equal(t["embed.weight"], hf["model.embed_tokens.weight"][rank * 80:(rank + 1) * 80])
        assert torch.equal(t["lm_head.weight"], hf["lm_head.weight"][rank * 80:(rank + 1) * 80])
        assert torch.equal(t["layers.1.mlp_norm.weight"], hf[p + "post_attention_layernorm.weight"])


def test_pp2_puts_layers_embedding_and_head_on_their_stages(tiny_model_dir, tmp_path):
    convert(tiny_model_dir("llama_tied"), tmp_path / "ckpt", dtype="float32", pp=2)
    first, last = (set(load_file(tmp_path / "ckpt" / f"rank{r}.safetensors")) for r in (0, 1))
    assert {"embed.weight", "layers.0.attn.qkv.weight"} <= first and not any(n.startswith("layers.1.") for n in first)
    assert "final_norm.weight" not in first and "layers.0.attn.qkv.weight" not in last
    # tied: the last stage computes logits from its own copy of the embedding
    assert {"layers.1.mlp.down.weight", "final_norm.weight", "embed.weight"} <= last


def test_mapping_the_model_cannot_divide_is_refused(tiny_model_dir, tmp_path):
    proc = trtbuild("convert", tiny_model_dir("llama"), tmp_path / "ckpt", "--tp", "3")  # exit 2, one line
    assert_user_error(proc, "--tp 3 does not divide", "4 heads, 2 KV heads", "valid --tp values: 1, 2, 4")
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(InputError, match=r"--pp 3 does not divide this model's 2 layers; valid --pp values: 1, 2$"):
        convert(tiny_model_dir("llama"), tmp_path / "ckpt", pp=3)
    with pytest.raises(UnsupportedError, match="llama-family decoders .* not gemma2"):
        convert(tiny_model_dir("gemma2"), tmp_path / "ckpt", tp=2)
    assert not (tmp_path / "ckpt").exists()
