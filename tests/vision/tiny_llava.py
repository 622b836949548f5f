"""A tiny random LlavaForConditionalGeneration made in code (never downloaded), for tests/vision."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from runner_engines import add_word_tokenizer
from tiny_models import COMMON, TINY_MODELS

IMAGE_TOKEN = 300  # inside the tiny vocabulary (320), as llava-1.5's 32000 is inside its padded 32064
# a processor config as llava-hf's preprocessor_config.json, sized for the tiny tower, with its own mean / std
PREPROCESSOR = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 32},
                "resample": 2, "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "do_rescale": True,
                "rescale_factor": 0.00392156862745098, "do_normalize": True, "image_mean": [0.5, 0.4, 0.3],
                "image_std": [0.2, 0.25, 0.3], "do_convert_rgb": True}


def tiny_llava(out: Path, feature_layer: int | list[int] = -2, strategy: str = "default", text: str = "llama") -> Path:
    """CLIP tower 32 wide, 2 layers, 4 heads, 32x32 images of 8x8 patches (16); TEXT the tiny_models one of that
    name (llama: COMMON's plain llama; qwen2: q/k/v biases, a sliding window above layer 1, yarn; mistral: a window).

    Weights at 10x transformers' init scale and norms / biases moved off their init (as tests/toy_arch does), so
    a wrong layout or a wrong hidden state changes the numbers rather than hiding under tiny activations."""
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                           num_attention_heads=4, image_size=32, patch_size=8,
                                           initializer_range=0.2)
    config_class, _, overrides = TINY_MODELS[text] if text != "llama" else ("LlamaConfig", None, {})
    text_config = getattr(transformers, config_class)(**{**COMMON, **overrides}, initializer_range=0.2)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text_config, image_token_index=IMAGE_TOKEN,
                                      vision_feature_layer=feature_layer, vision_feature_select_strategy=strategy,
                                      image_seq_length=16 + (strategy == "full"))
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name or "class_embedding" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    add_word_tokenizer(out, COMMON["vocab_size"])
    return out
