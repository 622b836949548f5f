"""Gemma 3: gemma2's layout plus (1+w) q/k norms and a separate rope base for local layers (gemma3_text); the
multimodal checkpoints (gemma3, Gemma3ForConditionalGeneration) add a SigLIP vision tower and Gemma 3's projector.

The multimodal converter keeps the text decoder's canonical names (gemma3_text's map under the language model's
prefix) and puts the tower and the projector under `vision.*` (formats/vision_spec.py: a siglip tower, its
post_layernorm, the pool_norm projector). mm_input_projection_weight is stored [vision, text] and multiplied from
the right; it is transposed to the canonical [out, in] on the way. SigLIP's attention-pooling head (absent from
Gemma 3's vision_use_head=False towers) feeds only SigLIP's pooled output and is dropped. The image processor's
config (Gemma3ImageProcessor: a resize to exactly height x width, no crop, mean / std 0.5) is kept in the VisionSpec;
pan-and-scan, which cuts one image into several, is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from converters.archs import hf_config
from converters.archs.gemma2 import GEMMA2_WEIGHT_MAP, gemma_block, gemma_outside_block
from converters.archs.llava import activation, image_processor_config, per_channel, resample_filter, vit_layer_map
from converters.registry import Converter, Target, register_converter
from converters.transforms import Transform, Transposed
from engine_builder.formats.model_config import LayerType, ModelConfig
from engine_builder.formats.vision_spec import ImageProcessorSpec, VisionSpec
from engine_builder.util.errors import InputError, UnsupportedError

GEMMA3_WEIGHT_MAP: dict[str, Target] = {
    **GEMMA2_WEIGHT_MAP,
    "model.layers.{layer}.self_attn.q_norm.weight": "layers.{layer}.attn.q_norm.weight",
    "model.layers.{layer}.self_attn.k_norm.weight": "layers.{layer}.attn.k_norm.weight",
}


@register_converter("gemma3_text")
class Gemma3TextConverter(Converter):
    weight_map = GEMMA3_WEIGHT_MAP

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        n, pattern = hf["num_hidden_layers"], hf.get("sliding_window_pattern", 6)
        # every pattern-th layer is global, the rest slide
        default: list[LayerType] = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
        return ModelConfig(architecture=cls.model_type, **hf_config.dims(hf),
                           rope=hf_config.rope(hf, hf_config.head_dim(hf), local=True),
                           block=gemma_block(hf, default, qk_norm=True), **gemma_outside_block(hf))


def _language_model(weight_map: dict[str, Target], prefix: str) -> dict[str, Target]:
    return {prefix + k.removeprefix("model."): v for k, v in weight_map.items() if k != "lm_head.weight"}


# Gemma3TextConfig's defaults of the keys the text converter reads (sliding_window_pattern 6 is its own default)
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216,
                                            num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                                            head_dim=256, hidden_activation="gelu_pytorch_tanh",
                                            max_position_embeddings=131072, rms_norm_eps=1e-6,
                                            query_pre_attn_scalar=256, sliding_window=4096)
GEMMA3_ROPE_4: dict[str, Any] = dict(rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)  # transformers 4's keys
# SiglipVisionConfig's defaults of the keys read here (a transformers 4 config.json saves a diff against them)
SIGLIP_DEFAULTS: dict[str, Any] = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                       num_attention_heads=12, num_channels=3, image_size=224, patch_size=16,
                                       hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
# Gemma3ImageProcessor's defaults (IMAGENET_STANDARD_MEAN / STD), its size the tower's
GEMMA3_PROCESSOR_DEFAULTS: dict[str, Any] = dict(do_convert_rgb=True, do_resize=True, resample=2, do_rescale=True,
                                                 rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5] * 3,
                                                 image_std=[0.5] * 3)
# transformers 4 (the hub's google/gemma-3-*), what transformers 5 saves, and transformers 5's module names
_TOWER_PREFIXES = ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.",
                   "model.vision_tower.")
_PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")


def _vision_map() -> dict[str, Target]:
    out: dict[str, Target] = {}
    for prefix in _TOWER_PREFIXES:
        out |= {
            prefix + "embeddings.patch_embedding.weight": "vision.embed.patch.weight",
            prefix + "embeddings.patch_embedding.bias": "vision.embed.patch.bias",
            prefix + "embeddings.position_embedding.weight": "vision.embed.position.weight",
            prefix + "embeddings.position_ids": None,  # a buffer of arange(patches)
            prefix + "post_layernorm.weight": "vision.post_norm.weight",
            prefix + "post_layernorm.bias": "vision.post_norm.bias",
            prefix + "head.*": None,  # SigLIP's attention-pooling head: its pooled output, which Gemma 3 never reads
        } | vit_layer_map(prefix)
    for prefix in _PROJECTOR_PREFIXES:
        out |= {prefix + "mm_soft_emb_norm.weight": "vision.projector.norm.weight",
                prefix + "mm_input_projection_weight": "vision.projector.proj.weight"}
    return out


@register_converter("gemma3")
class Gemma3Converter(Converter):
    """Multimodal Gemma 3: the text decoder under its usual names, the SigLIP tower and projector under vision.*."""

    weight_map = {
        **_language_model(GEMMA3_WEIGHT_MAP, "model.language_model."),  # transformers 5 names
        **_language_model(GEMMA3_WEIGHT_MAP, "language_model.model."),  # transformers 4 names
        "lm_head.weight": "lm_head.weight",
        "language_model.lm_head.weight": "lm_head.weight",
        **_vision_map(),
    }
    transforms: dict[str, Transform] = {prefix + "mm_input_projection_weight": Transposed()
                                        for prefix in _PROJECTOR_PREFIXES}  # [vision, text] -> [text, vision]

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return cls.config_from_source(hf, None)

    @classmethod
    def config_from_source(cls, hf: dict[str, Any], root: Path | None) -> ModelConfig:
        given = hf.get("text_config") or {}
        # a transformers 4 config.json saves text_config as a diff against Gemma3TextConfig (google/gemma-3-4b-it's
        # has no heads, head_dim or rope bases): its defaults for what it leaves out
        defaults = GEMMA3_TEXT_DEFAULTS if "rope_parameters" in given else {**GEMMA3_TEXT_DEFAULTS, **GEMMA3_ROPE_4}
        text = {**defaults, "tie_word_embeddings": hf.get("tie_word_embeddings", True), **given}
        cfg = Gemma3TextConverter.config_from_hf(text)
        vision = vision_spec(hf, image_processor_config(root) if root is not None else None)
        return dataclasses.replace(cfg, architecture=cls.model_type, vision=vision)


def vision_spec(hf: dict[str, Any], processor: dict[str, Any] | None) -> VisionSpec:
    """The VisionSpec of gemma3 config.json HF, with the image processor's config PROCESSOR (None: none in the dir)."""
    vision = {**SIGLIP_DEFAULTS, **(hf.get("vision_config") or {})}
    if vision.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise UnsupportedError(f"gemma3 with a {vision['model_type']!r} vision tower is not supported; supported: "
                               "siglip_vision_model")
    image_size, patch = vision["image_size"], vision["patch_size"]
    if not isinstance(image_size, int) or not isinstance(patch, int):
        raise UnsupportedError(f"gemma3 vision_config image_size {image_size!r} / patch_size {patch!r}: only square "
                               "images and patches (one int each) are supported")
    tokens = hf.get("mm_tokens_per_image", 256)
    side, tokens_side = image_size // patch, int(tokens ** 0.5) if isinstance(tokens, int) and tokens > 0 else 0
    if image_size % patch or tokens_side ** 2 != tokens or side % tokens_side:
        raise UnsupportedError(f"gemma3 mm_tokens_per_image {tokens!r} is not a square whose side divides the "
                               f"{image_size // patch}x{image_size // patch} patch grid ({image_size}px images of "
                               f"{patch}px patches), which the projector's average pool needs")
    return VisionSpec(
        tower="siglip", hidden_size=vision["hidden_size"], intermediate_size=vision["intermediate_size"],
        num_layers=vision["num_hidden_layers"], num_heads=vision["num_attention_heads"], patch_size=patch,
        image_size=image_size, num_channels=vision["num_channels"],
        image_token_id=hf.get("image_token_index", hf.get("image_token_id", 262144)), tokens_per_image=tokens,
        layer_norm_eps=float(vision["layer_norm_eps"]),
        activation=activation(vision.get("hidden_act"), "vision_config.hidden_act", "gemma3"),
        feature_layers=(-1,), feature_select_strategy="full", post_norm=True, projector="pool_norm",
        image_attention="bidirectional",
        image_start_token_id=hf.get("boi_token_index", hf.get("boi_token_id", 255999)),
        image_end_token_id=hf.get("eoi_token_index", hf.get("eoi_token_id", 256000)),
        processor=image_processor(processor or {}, image_size))


def image_processor(config: dict[str, Any], image_size: int) -> ImageProcessorSpec:
    """ImageProcessorSpec from a Gemma3ImageProcessor config: a resize to exactly height x width, no crop;
    Gemma3ImageProcessor's defaults (sized to the tower, IMAGE_SIZE) for what it leaves out or sets to null."""
    if config.get("do_pan_and_scan"):
        raise UnsupportedError("gemma3 image processor do_pan_and_scan (one image cut into several crops) is not "
                               "supported; set it to false in preprocessor_config.json")
    config = {**GEMMA3_PROCESSOR_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    size = config.get("size", {"height": image_size, "width": image_size})
    if isinstance(size, int):
        size = {"height": size, "width": size}
    if not isinstance(size, dict) or not {"height", "width"} <= size.keys():
        raise InputError(f"gemma3 image processor config: size {size!r} is not a height and width; fix "
                         "preprocessor_config.json")
    resample = resample_filter(config["resample"])
    mean, std = per_channel(config["image_mean"]), per_channel(config["image_std"])
    return ImageProcessorSpec(
        do_convert_rgb=bool(config["do_convert_rgb"]), do_pad=False, do_resize=bool(config["do_resize"]),
        shortest_edge=None, height=size["height"], width=size["width"], resample=resample,
        do_center_crop=False, do_rescale=bool(config["do_rescale"]), rescale_factor=float(config["rescale_factor"]),
        do_normalize=bool(config["do_normalize"]), image_mean=mean, image_std=std)
