"""A tiny random Idefics3ForConditionalGeneration (what SmolVLM is) made in code (never downloaded), for tests/vision;
with a word tokenizer that knows Idefics3Processor's tokens, so transformers' own processor lays out its prompts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tiny_models import COMMON

IMAGE_SIZE, PATCH, SCALE = 32, 8, 2  # a 4x4 patch grid, pixel-shuffled 2x2 into 4 image tokens per tile
TOKENS_PER_TILE = (IMAGE_SIZE // PATCH) ** 2 // SCALE ** 2
LONGEST_EDGE = 2 * IMAGE_SIZE  # an image resized to 64 px on its longer side: up to 2x2 tiles + the global image
# ids inside the tiny vocabulary (320), as SmolVLM's <image> 49190 is inside its 49280
NEWLINE, DOUBLE_NEWLINE, FAKE_TOKEN, GLOBAL_TOKEN, ROW_COL_FIRST, IMAGE_TOKEN, END_OF_UTTERANCE = (
    260, 261, 262, 263, 264, 300, 301)
SPECIAL = {"<fake_token_around_image>": FAKE_TOKEN, "<global-img>": GLOBAL_TOKEN, "<image>": IMAGE_TOKEN,
           "<end_of_utterance>": END_OF_UTTERANCE,
           **{f"<row_{i + 1}_col_{j + 1}>": ROW_COL_FIRST + 6 * i + j for i in range(6) for j in range(6)}}
# a processor config as HuggingFaceTB/SmolVLM-256M-Instruct's preprocessor_config.json, sized for the tiny tower
PREPROCESSOR = {"image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor",
                "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
                "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "max_image_size": {"longest_edge": IMAGE_SIZE}, "resample": 1,
                "rescale_factor": 0.00392156862745098, "size": {"longest_edge": LONGEST_EDGE}}


def tiny_idefics3(out: Path) -> Path:
    """SigLIP-style tower 32 wide, 2 layers, 4 heads, 32x32 tiles of 8x8 patches; the connector's pixel shuffle by 2
    (4 tokens per tile); COMMON's tiny llama as the text model.

    Norms and biases moved off their init, the weights at 10x transformers' init scale (as tiny_llava's), so a wrong
    layout, position or shuffle order changes the numbers."""
    vision = transformers.Idefics3VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                               num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                                               initializer_range=0.2)
    text = transformers.LlamaConfig(**COMMON, initializer_range=0.2)
    config = transformers.Idefics3Config(vision_config=vision, text_config=text, scale_factor=SCALE,
                                         image_token_id=IMAGE_TOKEN)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif "position_embedding" in name:
                p.copy_(torch.randn_like(p))
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    (out / "processor_config.json").write_text(json.dumps({"image_seq_len": TOKENS_PER_TILE,
                                                           "processor_class": "Idefics3Processor"}))
    add_idefics3_tokenizer(out, COMMON["vocab_size"])
    return out


def add_idefics3_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    """A word-level tokenizer over "w0".."w{n-1}" whose ids 260.. are "\\n", "\\n\\n" (one token, as a BPE merges
    them) and Idefics3Processor's special tokens; words split on spaces, runs of newlines kept as words."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    named = {"\n": NEWLINE, "\n\n": DOUBLE_NEWLINE, **SPECIAL}
    for word, i in named.items():
        del vocab[f"w{i}"]
        vocab[word] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(" +"), behavior="removed"),
                                                 pre_tokenizers.Split(Regex("\n+"), behavior="isolated")])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2",
                                                pad_token="w0", unk_token="w0")
    fast.save_pretrained(hf_dir)


def idefics3_processor(hf_dir: Path) -> transformers.Idefics3Processor:
    """transformers' Idefics3Processor over the tiny dir's tokenizer and Idefics3ImageProcessorPil (what transformers
    uses without torchvision) from its preprocessor_config.json."""
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image_processor = Idefics3ImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items()
                                                   if k not in ("image_processor_type", "processor_class")})
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(hf_dir)
    return transformers.Idefics3Processor(image_processor, tokenizer, image_seq_len=TOKENS_PER_TILE)
