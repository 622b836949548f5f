"""A tiny random Gemma3ForConditionalGeneration made in code (never downloaded), for tests/vision."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from runner_engines import add_word_tokenizer
from tiny_models import COMMON, TINY_MODELS

IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN = 300, 298, 299  # inside the tiny vocabulary (320), as gemma-3's 262144 is
IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 56, 14, 4  # a 4x4 patch grid average-pooled 2x2 to 2x2 image tokens
# a processor config as google/gemma-3-4b-it's preprocessor_config.json (nulls included), sized for the tiny tower
PREPROCESSOR = {"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
                "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
                "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "image_seq_length": TOKENS_PER_IMAGE, "pan_and_scan_max_num_crops": None,
                "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None, "resample": 2,
                "rescale_factor": 0.00392156862745098, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}


def tiny_gemma3(out: Path) -> Path:
    """SigLIP tower 32 wide, 2 layers, 4 heads, 56x56 images of 14x14 patches (16), 4 tokens per image; the
    tiny_models gemma3_text text model (4 layers, sliding window 8 on every other layer, (1+w) q/k norms).

    Norms / biases moved off their init and the projection (zeros at init) random, so a wrong layout, norm offset
    or pooling changes the numbers; the text weights at transformers' init scale (at 10x, as tiny_llava's, this
    gemma settles on one repeated token, where a wrong step would hide)."""
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                             num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                                             vision_use_head=False, layer_norm_eps=1e-6)
    _, _, overrides = TINY_MODELS["gemma3_text"]
    text = transformers.Gemma3TextConfig(**{**COMMON, **overrides})
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
                                       image_token_index=IMAGE_TOKEN, boi_token_index=BOI_TOKEN,
                                       eoi_token_index=EOI_TOKEN)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "mm_input_projection_weight" in name:
                p.copy_(torch.randn_like(p) * 0.2)
            elif "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    add_word_tokenizer(out, COMMON["vocab_size"])
    return out
