"""LLaVA (LlavaForConditionalGeneration): a CLIP vision tower and a 2-layer projector before a llama / mistral /
qwen2 text decoder.

The text decoder is converted by the converter of its own model_type (text_config.model_type): its weight map
with the language model's prefix, its config_from_hf on text_config, so its tensors keep the canonical names the
decoder graph and every runtime read. The tower and the projector go under `vision.*` (formats/vision_spec.py);
the tower's post_layernorm feeds only CLIP's pooled output, which LLaVA never reads, and is dropped on purpose.
The image processor's config (preprocessor_config.json, or processor_config.json's image_processor) is kept in
the VisionSpec, CLIPImageProcessor's defaults sized to the tower when the dir has neither.

Three spellings of the tensor names are read: transformers 4 (`language_model.model.`, `vision_tower.vision_model.`,
the hub's llava-hf checkpoints), what transformers 5 saves (`language_model.model.`, `vision_tower.`) and its
module names (`model.language_model.`, `model.vision_tower.`, `lm_head.`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from converters.archs.llama import LlamaConverter
from converters.archs.mistral import MistralConverter
from converters.archs.qwen2 import Qwen2Converter
from converters.registry import Converter, Target, register_converter
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.vision_spec import (
    MAX_VISION_LAYERS,
    ImageProcessorSpec,
    Resample,
    VisionActivation,
    VisionSpec,
)
from engine_builder.util.errors import InputError, UnsupportedError
from engine_builder.util.input_files import MAX_CONFIG_BYTES, read_json

TEXT_CONVERTERS: dict[str, type[Converter]] = {"llama": LlamaConverter, "mistral": MistralConverter,
                                               "qwen2": Qwen2Converter}

# transformers' config-class defaults of the keys the converters read: a transformers 4 config.json saves its
# sub-configs as a diff against them (llava-1.5's text_config has no hidden_size: it is LlamaConfig's 4096)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                    rms_norm_eps=1e-6, sliding_window=4096),
    "qwen2": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                  num_attention_heads=32, max_position_embeddings=32768, rms_norm_eps=1e-6, max_window_layers=28),
}
CLIP_DEFAULTS: dict[str, Any] = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                     num_attention_heads=12, num_channels=3, image_size=224, patch_size=32,
                                     hidden_act="quick_gelu", layer_norm_eps=1e-5)
# LlavaConfig's vision tower when config.json has no vision_config at all (llava-1.5's CLIP ViT-L/14-336)
LLAVA_VISION_DEFAULTS: dict[str, Any] = {**CLIP_DEFAULTS, "hidden_size": 1024, "intermediate_size": 4096,
                                         "num_hidden_layers": 24, "num_attention_heads": 16, "image_size": 336,
                                         "patch_size": 14}

ACTIVATIONS: dict[str, VisionActivation] = {
    "quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu"}
RESAMPLE: dict[int, Resample] = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _text_map() -> dict[str, Target]:
    """Every supported text converter's weight map under the language model's two prefixes (the maps agree)."""
    out: dict[str, Target] = {}
    for text in TEXT_CONVERTERS.values():
        for template, target in text.weight_map.items():
            if template == "lm_head.weight":
                names = ["lm_head.weight", "language_model.lm_head.weight"]
            else:
                assert template.startswith("model."), template  # a text map this file does not know how to nest
                names = [prefix + template.removeprefix("model.")
                         for prefix in ("language_model.model.", "model.language_model.")]
            for name in names:
                assert out.get(name, target) == target, (name, target)
                out[name] = target
    return out


_CLIP_LAYER: dict[str, Target] = {
    "layer_norm1.weight": "attn_norm.weight", "layer_norm1.bias": "attn_norm.bias",
    **{f"self_attn.{name}_proj.{kind}": (f"attn.qkv.{kind}", part)
       for part, name in enumerate("qkv") for kind in ("weight", "bias")},
    "self_attn.out_proj.weight": "attn.o.weight", "self_attn.out_proj.bias": "attn.o.bias",
    "layer_norm2.weight": "mlp_norm.weight", "layer_norm2.bias": "mlp_norm.bias",
    "mlp.fc1.weight": "mlp.up.weight", "mlp.fc1.bias": "mlp.up.bias",
    "mlp.fc2.weight": "mlp.down.weight", "mlp.fc2.bias": "mlp.down.bias",
}


def vit_layer_map(prefix: str) -> dict[str, Target]:
    """A CLIP / SigLIP tower's encoder layers under PREFIX (the two name them alike), q/k/v fused into attn.qkv;
    listed by number up to MAX_VISION_LAYERS."""
    out: dict[str, Target] = {}
    for i in range(MAX_VISION_LAYERS):
        out |= {f"{prefix}encoder.layers.{i}.{name}": (f"vision.layers.{i}.{target[0]}", target[1])
                if isinstance(target, tuple) else f"vision.layers.{i}.{target}"
                for name, target in _CLIP_LAYER.items()}
    return out


def _vision_map() -> dict[str, Target]:
    """The CLIP tower and the projector. The tower's layers are listed by number (the registry's `{layer}` counts
    the text decoder's layers, which a tower may outnumber), up to MAX_VISION_LAYERS."""
    out: dict[str, Target] = {}
    for prefix in ("vision_tower.vision_model.", "vision_tower.", "model.vision_tower."):
        out |= {
            prefix + "embeddings.class_embedding": "vision.embed.class",
            prefix + "embeddings.patch_embedding.weight": "vision.embed.patch.weight",
            prefix + "embeddings.position_embedding.weight": "vision.embed.position.weight",
            prefix + "embeddings.position_ids": None,  # a buffer of arange(positions)
            prefix + "pre_layrnorm.weight": "vision.pre_norm.weight",  # sic: CLIP's spelling
            prefix + "pre_layrnorm.bias": "vision.pre_norm.bias",
            prefix + "post_layernorm.weight": None,  # CLIP's pooled output only, which LLaVA never reads
            prefix + "post_layernorm.bias": None,
        }
        out |= vit_layer_map(prefix)
    for prefix in ("multi_modal_projector.", "model.multi_modal_projector."):
        out |= {prefix + f"linear_{n}.{kind}": f"vision.projector.fc{n}.{kind}" for n in (1, 2)
                for kind in ("weight", "bias")}
    return out


@register_converter("llava")
class LlavaConverter(Converter):
    weight_map = {**_text_map(), **_vision_map()}

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return cls.config_from_source(hf, None)

    @classmethod
    def config_from_source(cls, hf: dict[str, Any], root: Path | None) -> ModelConfig:
        text = dict(hf.get("text_config") or {"model_type": "llama"})
        text_type = text.get("model_type", "llama")
        if text_type not in TEXT_CONVERTERS:
            raise UnsupportedError(f"llava with a {text_type!r} text model is not supported; supported text models: "
                                   f"{', '.join(TEXT_CONVERTERS)}")
        text = {**TEXT_DEFAULTS[text_type], **text}
        # LlavaConfig ties the embeddings when either level says so
        text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
        cfg = TEXT_CONVERTERS[text_type].config_from_hf(text)
        vision = vision_spec(hf, image_processor_config(root) if root is not None else None)
        return dataclasses.replace(cfg, architecture=cls.model_type, vision=vision)


def vision_spec(hf: dict[str, Any], processor: dict[str, Any] | None) -> VisionSpec:
    """The VisionSpec of llava config.json HF, with the image processor's config PROCESSOR (None: none in the dir)."""
    given = hf.get("vision_config")
    vision = LLAVA_VISION_DEFAULTS if given is None else {**CLIP_DEFAULTS, **given}
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise UnsupportedError(f"llava with a {vision['model_type']!r} vision tower is not supported; supported: "
                               "clip_vision_model")
    layers = hf.get("vision_feature_layer", -2)
    layers = (layers,) if isinstance(layers, int) else tuple(layers)
    strategy = hf.get("vision_feature_select_strategy", "default")
    image_size, patch = vision["image_size"], vision["patch_size"]
    patches = (image_size // patch) ** 2
    return VisionSpec(
        hidden_size=vision["hidden_size"], intermediate_size=vision["intermediate_size"],
        num_layers=vision["num_hidden_layers"], num_heads=vision["num_attention_heads"], patch_size=patch,
        image_size=image_size, num_channels=vision["num_channels"],
        image_token_id=hf.get("image_token_index", hf.get("image_token_id", 32000)),
        tokens_per_image=patches + (strategy == "full"), layer_norm_eps=float(vision["layer_norm_eps"]),
        activation=activation(vision.get("hidden_act"), "vision_config.hidden_act"), feature_layers=layers,
        feature_select_strategy=strategy,
        projector_activation=activation(hf.get("projector_hidden_act", "gelu"), "projector_hidden_act"),
        projector_bias=bool(hf.get("multimodal_projector_bias", True)),
        processor=image_processor(processor or {}, image_size))


def activation(name: Any, key: str, model: str = "llava") -> VisionActivation:
    if name not in ACTIVATIONS:
        raise UnsupportedError(f"{model} {key} {name!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def image_processor_config(root: Path) -> dict[str, Any] | None:
    """The image processor's config in HF dir ROOT: preprocessor_config.json (transformers 4, the hub), else
    processor_config.json's image_processor (transformers 5); None when there is neither."""
    flat, nested = root / "preprocessor_config.json", root / "processor_config.json"
    fix = "fix or delete it"
    if flat.is_file():
        data = read_json(flat, MAX_CONFIG_BYTES, fix)
    elif nested.is_file():
        data = read_json(nested, MAX_CONFIG_BYTES, fix)
        data = data.get("image_processor") if isinstance(data, dict) else data
        if data is None:
            return None
    else:
        return None
    if not isinstance(data, dict):
        raise InputError(f"{flat if flat.is_file() else nested}: the image processor's config is not a JSON object; "
                         f"{fix}")
    return data


def image_processor(config: dict[str, Any], image_size: int) -> ImageProcessorSpec:
    """ImageProcessorSpec from an HF image processor config; CLIPImageProcessor's defaults (resize and crop at
    IMAGE_SIZE, the tower's) for what it leaves out."""
    size = config.get("size", {"shortest_edge": image_size})
    if isinstance(size, int):  # old feature extractors: the shorter edge
        size = {"shortest_edge": size}
    crop = config.get("crop_size", {"height": image_size, "width": image_size})
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    if not isinstance(size, dict) or not isinstance(crop, dict):
        raise InputError(f"image processor config: size {size!r} / crop_size {crop!r} are not sizes; fix "
                         "preprocessor_config.json")
    defaults = ImageProcessorSpec()
    return ImageProcessorSpec(
        do_convert_rgb=bool(config.get("do_convert_rgb", True)), do_pad=bool(config.get("do_pad", False)),
        do_resize=bool(config.get("do_resize", True)), shortest_edge=size.get("shortest_edge"),
        height=size.get("height"), width=size.get("width"),
        resample=resample_filter(config.get("resample", 3)),
        do_center_crop=bool(config.get("do_center_crop", True)),
        crop_height=crop.get("height", image_size), crop_width=crop.get("width", image_size),
        do_rescale=bool(config.get("do_rescale", True)),
        rescale_factor=float(config.get("rescale_factor", defaults.rescale_factor)),
        do_normalize=bool(config.get("do_normalize", True)),
        image_mean=per_channel(config.get("image_mean", defaults.image_mean)),
        image_std=per_channel(config.get("image_std", defaults.image_std)))


def resample_filter(value: Any) -> Resample:
    """An image processor config's resample (PIL's filter number, or its name) as the spec names it."""
    if value not in RESAMPLE and value not in RESAMPLE.values():
        raise UnsupportedError(f"image processor resample {value!r} is not one of PIL's filters 0..5")
    return RESAMPLE.get(value, value)


def per_channel(value: Any) -> tuple[float, ...]:
    """image_mean / image_std: one number for every channel, or one per channel."""
    return (float(value),) * 3 if isinstance(value, int | float) else tuple(float(v) for v in value)
