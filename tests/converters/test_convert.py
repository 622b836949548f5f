"""convert on a tiny random model of every architecture: tensors, fusions, config fields."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

import converters
from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.formats.model_config import AttentionSpec, BlockSpec, MlpSpec, NormSpec, ResidualSpec


def hf_state(hf_dir) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(shard))
    return state


@pytest.fixture
def converted(arch, tiny_model_dir, tmp_path):
    hf_dir = tiny_model_dir(arch)
    result = convert(hf_dir, tmp_path / "ckpt")
    return arch, hf_dir, tmp_path / "ckpt", result


def test_every_tensor_consumed_and_fused_layouts_equal_cat(converted):
    _, hf_dir, ckpt, result = converted
    state = hf_state(hf_dir)
    hf_config = json.loads((hf_dir / "config.json").read_text())
    out = load_file(ckpt / "rank0.safetensors")
    cfg = CheckpointConfig.load(ckpt).model
    plan = converters.registry.plan_conversion(converters.get_converter(hf_config["model_type"]), cfg,
                                           {k: converters.registry.TensorInfo(tuple(v.shape), "float32")
                                            for k, v in state.items()})
    consumed = {s for t in plan.tensors for s in t.sources} | set(plan.dropped)
    assert consumed == set(state)
    assert set(out) == {t.name for t in plan.tensors} == set(expected_shapes(cfg))
    for t in plan.tensors:
        expected = torch.cat([state[s] for s in t.sources], dim=0)
        assert tuple(out[t.name].shape) == t.shape
        assert torch.equal(out[t.name], expected), t.name
    # the fused q/k/v is [q; k; v] along rows, checked against the named HF tensors directly
    if "model.layers.0.self_attn.q_proj.weight" in state:
        q, k, v = (state[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
        assert torch.equal(out["layers.0.attn.qkv.weight"], torch.cat([q, k, v]))
        gate, up = (state[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up"))
        assert torch.equal(out["layers.0.mlp.gate_up.weight"], torch.cat([gate, up]))
    assert result.tensors == len(out)
    assert result.bytes == sum(t.numel() * t.element_size() for t in out.values())


def test_config_fields_match_transformers(converted):
    arch, hf_dir, ckpt, _ = converted
    hf = transformers.AutoConfig.from_pretrained(hf_dir)
    ckpt_cfg = CheckpointConfig.load(ckpt)
    cfg = ckpt_cfg.model
    assert ckpt_cfg.dtype == "float32" and ckpt_cfg.source.format == "hf-safetensors"
    assert ckpt_cfg.source.model_type == hf.model_type
    assert [f.name for f in ckpt_cfg.source.files] == ["config.json", "model.safetensors"]
    assert all(len(f.sha256) == 64 and f.size > 0 for f in ckpt_cfg.source.files)
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (
        hf.vocab_size, hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers)
    assert (cfg.num_heads, cfg.num_kv_heads) == (hf.num_attention_heads, hf.num_key_value_heads)
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert cfg.head_dim == head_dim
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    block = cfg.block
    assert block.norm.kind == "rms_norm" and block.mlp.kind == "gated"
    assert block.norm.eps == pytest.approx(hf.rms_norm_eps)
    # rope: transformers 5 keeps everything in rope_parameters (per layer type for gemma3)
    params = hf.rope_parameters.get("full_attention", hf.rope_parameters)
    assert cfg.rope.theta == params["rope_theta"]
    assert cfg.rope.scaling.type == {"su": "longrope"}.get(params["rope_type"], params["rope_type"])
    assert cfg.rope.dim == int(head_dim * (params.get("partial_rotary_factor") or 1.0))
    if params["rope_type"] != "default":
        if "factor" in params:
            assert cfg.rope.scaling.factor == params["factor"]
    layer_types = getattr(hf, "layer_types", None)
    if layer_types:
        assert list(block.attention.layer_types) == list(layer_types)
    window = getattr(hf, "sliding_window", None)
    assert block.attention.sliding_window == (window if "sliding_attention" in block.attention.layer_types else None)

    # the whole block spec of each architecture, as it lands in config.json
    norm, gemma_norm = NormSpec(eps=block.norm.eps), NormSpec(eps=block.norm.eps, weight_offset=1.0)
    gemma_residual = ResidualSpec(post_attention_norm=True, post_mlp_norm=True)
    expected_block = {
        "llama": BlockSpec(norm, AttentionSpec(layer_types=("full_attention",) * 2), MlpSpec()),
        "llama_tied": BlockSpec(norm, AttentionSpec(layer_types=("full_attention",) * 2), MlpSpec()),
        "mistral": BlockSpec(norm, AttentionSpec(sliding_window=8, layer_types=("sliding_attention",) * 2),
                             MlpSpec()),
        "qwen2": BlockSpec(norm, AttentionSpec(qkv_bias=True, sliding_window=8,
                                               layer_types=("full_attention", "sliding_attention")), MlpSpec()),
        "qwen3": BlockSpec(norm, AttentionSpec(qk_norm=True, layer_types=("full_attention",) * 2), MlpSpec()),
        "phi3": BlockSpec(norm, AttentionSpec(layer_types=("full_attention",) * 2), MlpSpec()),
        "gemma2": BlockSpec(gemma_norm,
                            AttentionSpec(scale=24 ** -0.5, logit_softcap=50.0, sliding_window=8,
                                          layer_types=("sliding_attention", "full_attention") * 2),
                            MlpSpec(activation="gelu_tanh"), gemma_residual),
        "gemma3_text": BlockSpec(gemma_norm,
                                 AttentionSpec(qk_norm=True, scale=0.25, sliding_window=8,
                                               layer_types=("sliding_attention", "full_attention") * 2),
                                 MlpSpec(activation="gelu_tanh"), gemma_residual),
    }[arch]
    assert block == expected_block
    expected = {
        "llama": dict(embedding_multiplier=1.0, final_logit_softcap=None),
        "llama_tied": dict(tie_word_embeddings=True, head_dim=32),
        "gemma2": dict(final_logit_softcap=30.0, embedding_multiplier=math.sqrt(64)),
        "gemma3_text": dict(final_logit_softcap=None, embedding_multiplier=math.sqrt(64)),
    }.get(arch, {})
    for key, value in expected.items():
        assert getattr(cfg, key) == value, key
    if hf.model_type == "phi3":
        assert cfg.rope.scaling.short_factor == tuple(params["short_factor"])
        assert cfg.rope.scaling.long_factor == tuple(params["long_factor"])
        assert cfg.rope.scaling.original_max_position_embeddings == 64
    if hf.model_type == "gemma3_text":
        assert cfg.rope.local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]
        assert cfg.rope.scaling.type == "linear" and cfg.rope.scaling.factor == 4.0
    if hf.model_type == "llama" and cfg.rope.scaling.type == "llama3":
        assert (cfg.rope.scaling.low_freq_factor, cfg.rope.scaling.high_freq_factor) == (1.0, 4.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_cast(tiny_model_dir, tmp_path, dtype):
    hf_dir = tiny_model_dir("llama")
    result = convert(hf_dir, tmp_path / "ckpt", dtype=dtype)
    assert result.dtype == dtype
    out = load_file(tmp_path / "ckpt" / "rank0.safetensors")
    state = hf_state(hf_dir)
    assert all(t.dtype == getattr(torch, dtype) for t in out.values())
    assert torch.equal(out["embed.weight"], state["model.embed_tokens.weight"].to(getattr(torch, dtype)))
    assert CheckpointConfig.load(tmp_path / "ckpt").dtype == dtype


def test_sharded_checkpoint_with_index(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    shards = sorted((tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    convert(tmp_path / "hf", tmp_path / "ckpt")
    out = load_file(tmp_path / "ckpt" / "rank0.safetensors")
    state = model.state_dict()
    assert torch.equal(out["layers.1.mlp.down.weight"], state["model.layers.1.mlp.down_proj.weight"])
    assert len(CheckpointConfig.load(tmp_path / "ckpt").source.files) == len(shards) + 1


def test_output_is_valid_safetensors_with_header_metadata(tiny_model_dir, tmp_path):
    convert(tiny_model_dir("qwen2"), tmp_path / "ckpt")
    with safe_open(tmp_path / "ckpt" / "rank0.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert list(f.keys())[0] == "embed.weight"


def test_generation_config_and_tokenizer_files_copied(tiny_model_dir, tmp_path):
    hf_dir = tiny_model_dir("llama")
    result = convert(hf_dir, tmp_path / "ckpt")
    gen = json.loads((tmp_path / "ckpt" / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    assert "generation_config.json" in result.tokenizer_files


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_streaming_peak_memory_is_bounded_by_largest_tensor(tmp_path, dtype):
    """A ~150 MB checkpoint: peak RSS above baseline stays <= 3x its largest tensor, whether
    tensors are cast (loaded one at a time) or copied file-to-file by the kernel."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=8192, hidden_size=1024, intermediate_size=2816,
                                      num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    from safetensors.torch import save_file

    (tmp_path / "hf").mkdir()
    config.save_pretrained(tmp_path / "hf")
    save_file({k: torch.rand(v.shape, dtype=torch.float32) for k, v in model.state_dict().items()},
              tmp_path / "hf" / "model.safetensors")
    result = convert(tmp_path / "hf", tmp_path / "ckpt", dtype=dtype)
    itemsize = 4 if dtype == "float32" else 2
    assert result.bytes > 50e6
    assert result.largest_tensor_bytes == 8192 * 1024 * itemsize
    ratio = result.peak_rss_bytes / result.largest_tensor_bytes
    print(f"{dtype}: peak RSS {ratio:.2f}x the largest tensor")
    assert ratio <= 3, result
    # unchanged dtype: bytes never enter the process; a cast holds two 4 MiB chunks at a time
    assert ratio < 0.5, result
    out = load_file(tmp_path / "ckpt" / "rank0.safetensors")
    assert out["layers.3.mlp.down.weight"].dtype == getattr(torch, dtype)
