"""Images on the torch backend (issue 35): LLM(engine, backend="torch").generate with images, the tiny llava and
Gemma 3 engines of tests/vision, on the CPU (float32, paged_attention_ref), against transformers' generate and the
onnxruntime twin's tokens: alone and batched with a text request; Gemma 3's image tokens attending to each other
both ways; a repeated image reusing its prefix blocks. The features come from vision.onnx in both backends."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from runner_engines import build_engine
from test_gemma3_vision import image_prompt
from test_llava_generate import GREEDY, LIMITS, TOKENS, hf_generate, png, prompt
from tiny_gemma3 import BOI_TOKEN, IMAGE_TOKEN, PREPROCESSOR, TOKENS_PER_IMAGE, tiny_gemma3
from tiny_llava import tiny_llava
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from converters.convert import convert
from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits

STEPS = 12


def generate(llm: LLM, prompts: list[list[int]], images: list[list[bytes]], params=GREEDY) -> list[list[int]]:
    return [list(o.token_ids) for o in llm.generate(prompt_token_ids=prompts, params=params, images=images)]


@pytest.fixture(scope="module")
def llava(module_tmp_factory):
    """(slot engine, transformers' model and processor)."""
    root = module_tmp_factory.mktemp("llava-torch")
    hf_dir = tiny_llava(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    return build_engine(root / "ckpt", root / "engine", LIMITS), (model, CLIPImageProcessorPil.from_pretrained(hf_dir))


@pytest.fixture(scope="module")
def llava_torch(llava):
    with LLM(llava[0], backend="torch") as llm:
        yield llm


def test_llava_images_alone_and_beside_text_equal_transformers_and_the_twin(llava, llava_torch):
    engine, hf = llava
    prompts = [prompt(1), prompt(2, images=0), prompt(3, images=2)]
    images = [[png(10)], [], [png(11), png(12, size=(30, 60))]]
    want = [hf_generate(hf, p, i) for p, i in zip(prompts, images)]
    assert len({tuple(w) for w in want}) == 3  # the images change the answer
    assert llava_torch.backend.takes_images
    assert generate(llava_torch, prompts, images) == want
    assert [generate(llava_torch, [p], [i])[0] for p, i in zip(prompts, images)] == want
    with LLM(engine, backend="onnxruntime") as twin:
        assert generate(twin, prompts, images) == want
    assert llava_torch.backend.kv.num_free == LIMITS.max_batch


def test_a_repeated_image_reuses_its_prefix_blocks_on_the_torch_backend(llava, llava_torch):
    cache = llava_torch.generator.prefix_cache
    ids = prompt(5)
    first = generate(llava_torch, [ids], [[png(20)]])[0]
    hits = cache.stats().hit_tokens
    assert generate(llava_torch, [ids], [[png(20)]])[0] == first
    reused = cache.stats().hit_tokens - hits
    assert reused >= TOKENS  # the image's blocks came from the cache (by reference: the paged pool)
    other = generate(llava_torch, [ids], [[png(21)]])[0]
    assert cache.stats().hit_tokens - hits - reused < 5  # at most the text block before the image: no image KV
    assert other == hf_generate(llava[1], ids, [png(21)]) != first


@pytest.fixture(scope="module")
def gemma3(module_tmp_factory):
    """(slot engine, transformers' model, the PNG, its pixel values as Gemma3ImageProcessor makes them)."""
    root = module_tmp_factory.mktemp("gemma3-torch")
    hf_dir = tiny_gemma3(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    engine = build_engine(root / "ckpt", root / "engine", Limits(max_batch=2, max_input_len=48, max_seq_len=64))
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(20).integers(0, 256, (40, 48, 3), np.uint8)).save(buffer, "PNG")
    processor = Gemma3ImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if v is not None and k not in (
        "image_processor_type", "processor_class", "image_seq_length")})
    pixels = processor(Image.open(io.BytesIO(buffer.getvalue())), return_tensors="pt")["pixel_values"]
    return engine, model, buffer.getvalue(), pixels


def test_gemma3_images_attend_both_ways_and_equal_transformers_and_the_twin(gemma3):
    """The features spliced after the sqrt(hidden) scale, unscaled; an image's tokens seeing each other both ways (in
    the reference attention): transformers given Gemma3Processor's token_type_ids, which a causal image misses."""
    engine, hf, png_bytes, pixels = gemma3
    image, text = image_prompt(5), np.random.default_rng(6).integers(3, BOI_TOKEN, 15).tolist()
    types = torch.tensor([[int(t == IMAGE_TOKEN) for t in image]])

    def hf_tokens(ids: list[int], **kwargs) -> list[int]:
        with torch.no_grad():
            return hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=STEPS, pad_token_id=0,
                               **kwargs)[0, len(ids):].tolist()

    want = [hf_tokens(image, pixel_values=pixels, token_type_ids=types), hf_tokens(text)]
    causal = hf_tokens(image, pixel_values=pixels)  # without token_type_ids: the image's tokens causal
    assert want[0] != causal  # attending both ways changes the answer
    params = SamplingParams(temperature=0, max_new_tokens=STEPS, ignore_eos=True)
    with LLM(engine, backend="torch") as llm:
        assert generate(llm, [image, text], [[png_bytes], []], params) == want
        hits = llm.generator.prefix_cache.stats().hit_tokens
        assert generate(llm, [image], [[png_bytes]], params) == want[:1]
        # the first block (bos, text, the whole image) from the cache: its keys were written seeing the image both ways
        assert llm.generator.prefix_cache.stats().hit_tokens - hits >= image.index(IMAGE_TOKEN) + TOKENS_PER_IMAGE
    with LLM(engine, backend="onnxruntime") as twin:
        assert generate(twin, [image, text], [[png_bytes], []], params) == want
