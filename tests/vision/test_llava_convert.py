"""LLaVA convert: the text decoder under its usual canonical names, the CLIP tower and projector under vision.*,
the VisionSpec (and the image processor's config) saved with config.json; read against transformers' own config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from tiny_llava import IMAGE_TOKEN, PREPROCESSOR, tiny_llava
from tiny_models import COMMON

from converters.archs.llava import LlavaConverter
from converters.convert import convert
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.util.errors import ConfigError, UnsupportedError

# llava-hf/llava-1.5-7b-hf's config.json as transformers 4 saved it: sub-configs as diffs against their classes
LLAVA_15 = {
    "architectures": ["LlavaForConditionalGeneration"], "ignore_index": -100, "image_token_index": 32000,
    "model_type": "llava", "pad_token_id": 32001, "projector_hidden_act": "gelu",
    "text_config": {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                    "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                    "torch_dtype": "float16", "vocab_size": 32064},
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.36.0.dev0",
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": 32064,
}


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llava")
    hf_dir = tiny_llava(root / "hf")
    result = convert(hf_dir, root / "ckpt", dtype="float32")
    # dropped on purpose, and nothing else: the tower's post-norm (CLIP's pooled output, which LLaVA never reads)
    assert sorted(result.dropped) == ["vision_tower.post_layernorm.bias", "vision_tower.post_layernorm.weight"]
    return hf_dir, root / "ckpt"


def test_vision_spec_and_processor_from_the_hf_dir(llava):
    hf_dir, ckpt = llava
    model = CheckpointConfig.load(ckpt).model  # saved and read back through config.json
    hf = transformers.LlavaConfig.from_pretrained(hf_dir)
    v = model.vision
    assert model.architecture == "llava" and v is not None
    assert (v.hidden_size, v.intermediate_size, v.num_layers, v.num_heads, v.patch_size, v.image_size) == (
        hf.vision_config.hidden_size, hf.vision_config.intermediate_size, hf.vision_config.num_hidden_layers,
        hf.vision_config.num_attention_heads, hf.vision_config.patch_size, hf.vision_config.image_size)
    assert (v.activation, v.layer_norm_eps, v.projector_activation, v.projector_bias) == (
        "quick_gelu", 1e-5, "gelu", True)
    assert (v.feature_layers, v.feature_select_strategy, v.image_token_id, v.tokens_per_image) == (
        (-2,), "default", IMAGE_TOKEN, 16)
    p = v.processor
    assert (p.shortest_edge, p.crop_height, p.crop_width, p.resample) == (32, 32, 32, "bilinear")
    assert (p.image_mean, p.image_std) == (tuple(PREPROCESSOR["image_mean"]), tuple(PREPROCESSOR["image_std"]))
    # the text decoder is the llama converter's, dims as the text config says
    assert (model.hidden_size, model.num_layers, model.vocab_size) == (64, 2, COMMON["vocab_size"])
    assert model.block == LlavaConverter.config_from_hf({"text_config": hf.text_config.to_dict()}).block


def test_every_tensor_mapped_and_the_tower_fused_as_cat(llava):
    hf_dir, ckpt = llava
    with safe_open(hf_dir / "model.safetensors", "pt") as src, safe_open(ckpt / "rank0.safetensors", "pt") as out:
        names = set(out.keys())
        assert "embed.weight" in names and "layers.1.attn.qkv.weight" in names  # the decoder's usual names
        vision = {n for n in names if n.startswith("vision.")}
        assert {"vision.embed.class", "vision.pre_norm.bias", "vision.layers.1.mlp.down.bias",
                "vision.projector.fc2.bias"} <= vision
        assert vision == {n for n in expected_shapes(CheckpointConfig.load(ckpt).model) if n.startswith("vision.")}
        prefix = next(p for p in ("vision_tower.vision_model.", "vision_tower.")
                      if p + "pre_layrnorm.weight" in src.keys())
        for kind in ("weight", "bias"):
            want = torch.cat([src.get_tensor(f"{prefix}encoder.layers.1.self_attn.{n}_proj.{kind}") for n in "qkv"])
            assert torch.equal(out.get_tensor(f"vision.layers.1.attn.qkv.{kind}"), want)
        assert torch.equal(out.get_tensor("vision.embed.patch.weight"),
                           src.get_tensor(prefix + "embeddings.patch_embedding.weight"))
        assert torch.equal(out.get_tensor("vision.projector.fc1.weight"),
                           src.get_tensor("multi_modal_projector.linear_1.weight"))


# what transformers 5 saves -> the hub's transformers 4 names, and transformers 5's module names
RENAMES = {
    "hub": lambda n: n.replace("vision_tower.", "vision_tower.vision_model.", 1),
    "modules": lambda n: ("lm_head.weight" if n == "language_model.lm_head.weight" else
                          n.replace("language_model.model.", "model.language_model.", 1)
                          .replace("vision_tower.", "model.vision_tower.", 1)
                          .replace("multi_modal_projector.", "model.multi_modal_projector.", 1)),
}


@pytest.mark.parametrize("spelling", sorted(RENAMES))
def test_every_spelling_of_the_names_converts_alike(llava, tmp_path, spelling):
    hf_dir, ckpt = llava
    src = tmp_path / "hf"
    src.mkdir()
    with safe_open(hf_dir / "model.safetensors", "pt") as f:
        original = set(f.keys())
        renamed = {RENAMES[spelling](n): f.get_tensor(n) for n in original}
    assert not set(renamed) & {n for n in original if "vision_tower" in n}
    save_file(renamed, str(src / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        (src / name).write_bytes((hf_dir / name).read_bytes())
    convert(src, tmp_path / "ckpt", dtype="float32")
    with safe_open(ckpt / "rank0.safetensors", "pt") as want, safe_open(tmp_path / "ckpt" / "rank0.safetensors",
                                                                      "pt") as got:
        assert set(got.keys()) == set(want.keys())
        assert all(torch.equal(got.get_tensor(n), want.get_tensor(n)) for n in want.keys())


def test_llava_15_config_reads_as_transformers_reads_it():
    """Sub-configs saved as diffs take their classes' defaults; the tower and text dims equal transformers'."""
    model = LlavaConverter.config_from_hf(LLAVA_15)
    model.validate()
    hf = transformers.LlavaConfig(**LLAVA_15)
    t, v = hf.text_config, hf.vision_config
    assert (model.vocab_size, model.hidden_size, model.intermediate_size, model.num_layers, model.num_heads,
            model.num_kv_heads, model.max_position_embeddings, model.block.norm.eps) == (
        t.vocab_size, t.hidden_size, t.intermediate_size, t.num_hidden_layers, t.num_attention_heads,
        t.num_key_value_heads, t.max_position_embeddings, t.rms_norm_eps)
    s = model.vision
    assert (s.hidden_size, s.intermediate_size, s.num_layers, s.num_heads, s.patch_size, s.image_size,
            s.layer_norm_eps) == (v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads,
                                  v.patch_size, v.image_size, v.layer_norm_eps)
    assert (s.tokens_per_image, s.image_token_id, s.layers_computed()) == (576, 32000, 23)  # layer 24 never runs
    # no preprocessor config: CLIPImageProcessor's defaults, sized to the 336 tower
    p = s.processor
    assert (p.shortest_edge, p.crop_height, p.resample, p.image_mean) == (336, 336, "bicubic",
                                                                          (0.48145466, 0.4578275, 0.40821073))


def test_unsupported_text_model_is_refused_by_name():
    with pytest.raises(UnsupportedError, match="'gemma'.*llama, mistral, qwen2"):
        LlavaConverter.config_from_hf({**LLAVA_15, "text_config": {"model_type": "gemma"}})


def test_processor_config_of_transformers_5_is_read(tmp_path):
    """transformers 5 saves a processor's image processor inside processor_config.json."""
    (tmp_path / "processor_config.json").write_text(json.dumps({
        "image_processor": {**PREPROCESSOR, "size": {"shortest_edge": 336}, "crop_size": {"height": 336,
                                                                                         "width": 336}},
        "patch_size": 14, "processor_class": "LlavaProcessor"}))
    spec = LlavaConverter.config_from_source(LLAVA_15, tmp_path).vision.processor
    assert (spec.shortest_edge, spec.crop_width, spec.resample, spec.image_std) == (336, 336, "bilinear",
                                                                                  (0.2, 0.25, 0.3))


@pytest.mark.parametrize("change, message", [
    ({"image_token_index": 40000}, "image_token_id 40000 is outside the vocabulary"),
    ({"vision_feature_layer": -26}, "feature_layers \\[-26\\] must name hidden states of a 24-layer tower"),
])
def test_a_vision_config_the_graph_cannot_take_is_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        LlavaConverter.config_from_hf({**LLAVA_15, **change}).validate()


def test_a_processor_cropping_another_size_than_the_tower_is_refused(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))  # 32x32 crops, a 336 tower
    with pytest.raises(ConfigError, match="makes 32x32 images but the tower takes 336x336"):
        LlavaConverter.config_from_source(LLAVA_15, tmp_path).validate()
