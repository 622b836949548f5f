"""Time to first token of an image request: LLaVA at a small real shape, `LLM.generate` on the onnxruntime twin vs
Hugging Face's LlavaForConditionalGeneration.generate, cold and with the image repeated.

    .venv/bin/python benchmarks/vision_ttft.py [--runs 5] [--threads N] [--work build/bench-vision] [--json]

Random weights (nothing is downloaded) in the shape of a CLIP ViT-B/16 tower at 224 px (12 layers, hidden 768,
196 image tokens, llava's feature layer -2) before a SmolLM2-135M-shaped llama decoder (30 layers, hidden 576, 9
heads / 3 KV heads, vocab 49152), float32 on CPU, batch 1. A request is a 224x224 PNG and a prompt of ~20 text
tokens around one image token; TTFT = wall time of generate(max_new_tokens=1), image decoding, preprocessing, the
vision graph and the prefill included (HF: its image processor on the same PNG, then generate).

    cold      a new image each run: every image position prefilled, the vision graph run
    repeated  the same image and prompt as the run before: trtbuild reuses the image's features and its KV blocks
              (the prefix cache keys image positions by the pixels' hash), HF computes everything again

The contenders alternate every run, the figures are medians; the greedy tokens of both must agree (printed).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IMAGE_TOKEN = 49151  # the last id of the vocabulary, as llava-1.5's image token sits past its text vocabulary
PREPROCESSOR = {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 224},
                "resample": 3, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}, "do_rescale": True,
                "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}


def prepare(work: Path) -> tuple[Path, Path]:
    """HF dir (random weights, a word-level tokenizer over its vocab) and its float32 onnxruntime engine."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    hf_dir, engine = work / "hf", work / "engine"
    if not hf_dir.exists():
        vision = transformers.CLIPVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                               num_attention_heads=12, image_size=224, patch_size=16)
        text = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                        max_position_embeddings=2048, tie_word_embeddings=True)
        config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                                          image_seq_length=196)
        torch.manual_seed(0)
        transformers.LlavaForConditionalGeneration(config).eval().save_pretrained(hf_dir)
        (hf_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
        tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(49152)}, unk_token="w0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(hf_dir)
    if not engine.exists():
        convert(hf_dir, work / "ckpt", dtype="float32", force=True)
        build(work / "ckpt", engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                 limits=Limits(max_batch=1, max_input_len=256, max_seq_len=320)))
    return hf_dir, engine


def png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (224, 224, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for both (default: physical cores)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-vision"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers
    from PIL import Image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from engine_builder import LLM, SamplingParams
    from engine_builder.util.cpu_cores import physical_cores

    threads = args.threads or physical_cores()
    torch.set_num_threads(threads)
    hf_dir, engine = prepare(args.work)
    llm = LLM(engine, backend="onnxruntime", threads=threads)
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32).eval()
    processor = CLIPImageProcessorPil.from_pretrained(hf_dir)
    one = SamplingParams(max_new_tokens=1, temperature=0)
    prompt = [1, *range(100, 110), IMAGE_TOKEN, *range(200, 210)]  # 21 tokens, one image token
    expanded = [t for i in prompt for t in ([i] * 196 if i == IMAGE_TOKEN else [i])]

    def ours(image: bytes) -> tuple[float, int]:
        started = time.perf_counter()
        out = llm.generate(prompt_token_ids=[prompt], params=one, images=[image])[0]
        return time.perf_counter() - started, out.token_ids[0]

    def theirs(image: bytes) -> tuple[float, int]:
        started = time.perf_counter()
        pixels = processor(Image.open(io.BytesIO(image)), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            out = hf.generate(torch.tensor([expanded]), pixel_values=pixels, max_new_tokens=1, do_sample=False,
                              pad_token_id=0)
        return time.perf_counter() - started, int(out[0, -1])

    ours(png(999)), theirs(png(999))  # warm-up: sessions, allocators
    times: dict[str, list[float]] = {"trtbuild_cold": [], "trtbuild_repeated": [], "hf_cold": [], "hf_repeated": []}
    agree = True
    for run in range(args.runs):
        image = png(run)
        for name, fn in (("trtbuild", ours), ("hf", theirs)):
            cold, token = fn(image)
            repeated, again = fn(image)
            times[f"{name}_cold"].append(cold)
            times[f"{name}_repeated"].append(repeated)
            if name == "trtbuild":
                mine = token
            elif token != mine or again != token:
                agree = False
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    result = {"threads": threads, "runs": args.runs, "image_tokens": 196, "prompt_tokens": len(expanded),
              "ttft_ms": {k: round(v, 1) for k, v in med.items()},
              "repeated_over_cold": round(med["trtbuild_repeated"] / med["trtbuild_cold"], 3),
              "cold_vs_hf": round(med["hf_cold"] / med["trtbuild_cold"], 2),
              "repeated_vs_hf": round(med["hf_repeated"] / med["trtbuild_repeated"], 2),
              "first_tokens_agree": agree}
    if args.json:
        print(json.dumps(result))
        return
    print(f"TTFT, one 224x224 image (196 tokens) + 20 text tokens, {threads} threads, median of {args.runs}:")
    print(f"  trtbuild cold {med['trtbuild_cold']:.1f} ms, repeated image {med['trtbuild_repeated']:.1f} ms "
          f"({result['repeated_over_cold']:.3f} of cold)")
    print(f"  HF transformers cold {med['hf_cold']:.1f} ms, repeated {med['hf_repeated']:.1f} ms")
    print(f"  HF / trtbuild: cold {result['cold_vs_hf']}x, repeated {result['repeated_vs_hf']}x; "
          f"first tokens agree: {agree}")


if __name__ == "__main__":
    main()
