"""Idefics3 (Idefics3ForConditionalGeneration; SmolVLM is one): a SigLIP vision tower read through its post_layernorm,
the connector (a pixel shuffle by scale_factor, then one linear without bias) and a llama text decoder.

The text decoder keeps llama's canonical names (its weight map under `model.text_model.`); the tower and the
connector go under `vision.*` (formats/vision_spec.py: a siglip tower with post_norm, the pixel_shuffle projector).
transformers 4 (the hub's SmolVLM checkpoints) and 5 name the tensors alike.

The tower's position embedding is Idefics2/3's NaViT one: a patch's position is bucketized from its fractional
place in the image (Idefics3VisionEmbeddings), which for some grid sides (19, 25, 29, ...; not SmolVLM's 32 nor
Idefics3-8B's 26) is not the patch's own index in float32. Every tile the processor makes fills the tower's whole
grid, so those positions are fixed: the converter stores the row each patch adds (`PatchPositions`) and the graph
adds it as SigLIP's.

The image processor's config (preprocessor_config.json or processor_config.json's image_processor) is required:
its size, max_image_size and do_image_splitting say how an image becomes tiles (formats/vision_spec.py's
ImageTiling), and the tiles must be the tower's size. processor_config.json's image_seq_len, when given, must be
the tokens per tile the model makes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.archs.gemma3 import SIGLIP_DEFAULTS
from converters.archs.llama import LLAMA_WEIGHT_MAP, LlamaConverter
from converters.archs.llava import (
    TEXT_DEFAULTS,
    activation,
    image_processor_config,
    per_channel,
    resample_filter,
    vit_layer_map,
)
from converters.registry import Converter, Target, register_converter
from converters.transforms import Transform
from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.vision_spec import ImageProcessorSpec, ImageTiling, VisionSpec
from engine_builder.util.errors import InputError, UnsupportedError
from engine_builder.util.input_files import MAX_CONFIG_BYTES, read_json

if TYPE_CHECKING:
    import torch

TOWER, CONNECTOR = "model.vision_model.", "model.connector.modality_projection."
# Idefics3VisionConfig's defaults (a diffed config.json leaves them out), and Idefics3Config's text_config default
IDEFICS3_VISION_DEFAULTS: dict[str, Any] = {**SIGLIP_DEFAULTS, "hidden_size": 1152, "num_attention_heads": 16,
                                            "patch_size": 32}
IDEFICS3_TEXT_DEFAULTS: dict[str, Any] = {**TEXT_DEFAULTS["llama"], "rms_norm_eps": 1e-5}
# Idefics3ImageProcessor's defaults (IMAGENET_STANDARD_MEAN / STD, LANCZOS)
IDEFICS3_PROCESSOR_DEFAULTS: dict[str, Any] = dict(do_convert_rgb=True, do_resize=True, resample=1, do_rescale=True,
                                                   rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5] * 3,
                                                   image_std=[0.5] * 3, do_image_splitting=True, do_pad=True)


def patch_position_ids(side: int) -> list[int]:
    """The position id of each patch of a full side x side grid, row-major, as Idefics3VisionEmbeddings computes it
    (float32 fractional coordinates bucketized against arange(1/side, 1, 1/side))."""
    import torch

    boundaries = torch.arange(1 / side, 1.0, 1 / side)
    step = 1.0 / torch.tensor([side])
    coords = torch.clamp(torch.arange(side, dtype=torch.float32)[None, :] * step[:, None], max=1.0 - 1e-6)
    buckets = torch.bucketize(coords, boundaries, right=True)[0]
    return (buckets[:, None] * side + buckets[None, :]).reshape(-1).tolist()


@dataclass(frozen=True)
class PatchPositions:
    """The position embedding table [positions, hidden] -> the row each patch of a full image adds [patches, hidden]
    (the table gathered by patch_position_ids: the identity for most grid sides)."""

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def apply(self, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        import torch

        assert cfg.vision is not None
        side = cfg.vision.image_size // cfg.vision.patch_size
        return tensor[torch.tensor(patch_position_ids(side))].contiguous()


def _text_map() -> dict[str, Target]:
    return {("model.text_model." + k.removeprefix("model.")) if k.startswith("model.") else k: v
            for k, v in LLAMA_WEIGHT_MAP.items()}


@register_converter("idefics3")
class Idefics3Converter(Converter):
    weight_map = {
        **_text_map(),
        TOWER + "embeddings.patch_embedding.weight": "vision.embed.patch.weight",
        TOWER + "embeddings.patch_embedding.bias": "vision.embed.patch.bias",
        TOWER + "embeddings.position_embedding.weight": "vision.embed.position.weight",
        TOWER + "post_layernorm.weight": "vision.post_norm.weight",
        TOWER + "post_layernorm.bias": "vision.post_norm.bias",
        **vit_layer_map(TOWER),
        CONNECTOR + "proj.weight": "vision.projector.proj.weight",
    }
    transforms: dict[str, Transform] = {TOWER + "embeddings.position_embedding.weight": PatchPositions()}

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return cls.config_from_source(hf, None)

    @classmethod
    def config_from_source(cls, hf: dict[str, Any], root: Path | None) -> ModelConfig:
        text = dict(hf.get("text_config") or {})
        if text.get("model_type", "llama") != "llama":
            raise UnsupportedError(f"idefics3 with a {text['model_type']!r} text model is not supported; supported: "
                                   "llama")
        text = {**IDEFICS3_TEXT_DEFAULTS, **text}
        text["tie_word_embeddings"] = bool(hf.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
        cfg = LlamaConverter.config_from_hf(text)
        processor, seq_len = _processor_files(root) if root is not None else ({}, None)
        vision = vision_spec(hf, processor, seq_len)
        return dataclasses.replace(cfg, architecture=cls.model_type, vision=vision)


def _processor_files(root: Path) -> tuple[dict[str, Any], int | None]:
    """(the image processor's config, processor_config.json's image_seq_len or None) of HF dir ROOT."""
    processor = image_processor_config(root)
    if processor is None:
        raise InputError(f"{root} has no preprocessor_config.json (the image processor's config: size, "
                         "max_image_size, do_image_splitting); copy it from the model's repository into the dir")
    seq_len = None
    if (path := root / "processor_config.json").is_file():
        data = read_json(path, MAX_CONFIG_BYTES, "fix or delete it")
        seq_len = data.get("image_seq_len") if isinstance(data, dict) else None
    return processor, seq_len


def vision_spec(hf: dict[str, Any], processor: dict[str, Any], seq_len: Any = None) -> VisionSpec:
    """The VisionSpec of idefics3 config.json HF, its image processor's config PROCESSOR ({}: the processor's
    defaults sized to the tower) and processor_config.json's image_seq_len SEQ_LEN (None: not given)."""
    vision = {**IDEFICS3_VISION_DEFAULTS, **(hf.get("vision_config") or {})}
    if vision.get("model_type", "idefics3_vision") != "idefics3_vision":
        raise UnsupportedError(f"idefics3 with a {vision['model_type']!r} vision tower is not supported; supported: "
                               "idefics3_vision")
    image_size, patch, scale = vision["image_size"], vision["patch_size"], hf.get("scale_factor", 2)
    if not all(isinstance(v, int) and v > 0 for v in (image_size, patch, scale)):
        raise UnsupportedError(f"idefics3 vision_config image_size {image_size!r} / patch_size {patch!r} / "
                               f"scale_factor {scale!r}: only square images and patches (one int each) are supported")
    side = image_size // patch
    if image_size % patch or side % scale:
        raise UnsupportedError(f"idefics3 scale_factor {scale} does not divide the {side}x{side} patch grid "
                               f"({image_size}px images of {patch}px patches), which the pixel shuffle needs")
    tokens = side * side // (scale * scale)
    if seq_len is not None and seq_len != tokens:
        raise InputError(f"processor_config.json's image_seq_len {seq_len} is not the {tokens} tokens a tile makes "
                         f"({side}x{side} patches, scale_factor {scale}); fix processor_config.json")
    return VisionSpec(
        tower="siglip", hidden_size=vision["hidden_size"], intermediate_size=vision["intermediate_size"],
        num_layers=vision["num_hidden_layers"], num_heads=vision["num_attention_heads"], patch_size=patch,
        image_size=image_size, num_channels=vision["num_channels"],
        image_token_id=hf.get("image_token_id", 128257), tokens_per_image=tokens,
        layer_norm_eps=float(vision["layer_norm_eps"]),
        activation=activation(vision.get("hidden_act"), "vision_config.hidden_act", "idefics3"),
        feature_layers=(-1,), feature_select_strategy="full", post_norm=True, projector="pixel_shuffle",
        scale_factor=scale, prompt_layout="tile_grid", processor=image_processor(processor, image_size))


def image_processor(config: dict[str, Any], image_size: int) -> ImageProcessorSpec:
    """ImageProcessorSpec from an Idefics3ImageProcessor config; its defaults for what it leaves out or sets to null,
    the tiles sized to the tower (IMAGE_SIZE) and the image to 4 tiles a side when it names no sizes."""
    config = {**IDEFICS3_PROCESSOR_DEFAULTS, "size": {"longest_edge": 4 * image_size},
              "max_image_size": {"longest_edge": image_size}, **{k: v for k, v in config.items() if v is not None}}
    size, tile = config["size"], config["max_image_size"]
    if not (isinstance(size, dict) and isinstance(size.get("longest_edge"), int)
            and isinstance(tile, dict) and isinstance(tile.get("longest_edge"), int)):
        raise InputError(f"idefics3 image processor config: size {size!r} / max_image_size {tile!r} are not "
                         "{'longest_edge': N}; fix preprocessor_config.json")
    if tile["longest_edge"] != image_size:
        raise UnsupportedError(f"idefics3 image processor max_image_size {tile['longest_edge']} is not the vision "
                               f"tower's image_size {image_size}: each tile must be one image for the tower")
    resample = resample_filter(config["resample"])
    mean, std = per_channel(config["image_mean"]), per_channel(config["image_std"])
    # do_pad only evens out the sizes of a batch's images, which tiles of one size never need
    return ImageProcessorSpec(
        do_convert_rgb=bool(config["do_convert_rgb"]), do_pad=False, do_resize=bool(config["do_resize"]),
        shortest_edge=None, resample=resample, do_center_crop=False,
        do_rescale=bool(config["do_rescale"]), rescale_factor=float(config["rescale_factor"]),
        do_normalize=bool(config["do_normalize"]), image_mean=mean, image_std=std,
        tiling=ImageTiling(longest_edge=size["longest_edge"], tile_size=tile["longest_edge"],
                           split=bool(config["do_image_splitting"])))
