"""LLaVA through the runtime (issue 35): LLM.generate with images, the pipeline of runner/vision/ (Pillow loading,
the model's preprocessing, vision.onnx, image-token expansion, the splice in the prefill) and the step loop, against
transformers' LlavaForConditionalGeneration.generate on pixels its own image processor makes from the same PNGs.
Also: image and text requests in one generate, a repeated image reusing its KV blocks, a different image never
sharing any, and the one-line refusals."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from PIL import Image
from runner_engines import build_engine, build_paged_engine
from tiny_llava import IMAGE_TOKEN, tiny_llava
from tiny_models import COMMON
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

from converters.convert import convert
from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.util.errors import InputError

LIMITS = Limits(max_batch=4, max_input_len=64, max_seq_len=96)
TOKENS = 16  # tokens_per_image of the tiny tower
GREEDY = SamplingParams(max_new_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llava(module_tmp_factory) -> tuple[Path, Path, Path]:
    """(HF dir, slot engine, paged engine), float32 onnxruntime twins."""
    root = module_tmp_factory.mktemp("llava-generate")
    hf_dir = tiny_llava(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    return (hf_dir, build_engine(root / "ckpt", root / "engine", LIMITS),
            build_paged_engine(root / "ckpt", root / "paged", LIMITS))


@pytest.fixture(scope="module")
def hf(llava):
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        llava[0], dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    return model, CLIPImageProcessorPil.from_pretrained(llava[0])


def png(seed: int, size: tuple[int, int] = (48, 40)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def prompt(seed: int, images: int = 1) -> list[int]:
    """[bos, text, (<image>, text) per image]: one image token per image, as a user writes it."""
    text = np.random.default_rng(seed).integers(3, IMAGE_TOKEN, 4 * (images + 1)).tolist()
    ids = [COMMON["bos_token_id"], *text[:4]]
    for i in range(images):
        ids += [IMAGE_TOKEN, *text[4 * (i + 1):4 * (i + 2)]]
    return ids


def hf_generate(hf, ids: list[int], images: list[bytes], steps: int = GREEDY.max_new_tokens) -> list[int]:
    model, processor = hf
    expanded = [t for i in ids for t in ([i] * TOKENS if i == IMAGE_TOKEN else [i])]
    kwargs = {}
    if images:
        pil = [Image.open(io.BytesIO(b)) for b in images]
        kwargs["pixel_values"] = torch.from_numpy(processor(pil, return_tensors="np")["pixel_values"])
    with torch.no_grad():
        out = model.generate(torch.tensor([expanded]), do_sample=False, max_new_tokens=steps, pad_token_id=0, **kwargs)
    return out[0, len(expanded):].tolist()


@pytest.mark.parametrize("layout", ["slot", "paged"])
def test_image_and_text_requests_in_one_generate_equal_transformers(llava, hf, layout):
    engine = llava[1] if layout == "slot" else llava[2]
    llm = LLM(engine, backend="onnxruntime")
    prompts = [prompt(1), prompt(2, images=0), prompt(3, images=2)]
    images = [[png(10)], [], [png(11), png(12, size=(30, 60))]]
    want = [hf_generate(hf, p, i) for p, i in zip(prompts, images)]
    assert len({tuple(w) for w in want}) == 3  # the images change the answer
    got = llm.generate(prompt_token_ids=prompts, params=GREEDY, images=images)
    assert [list(o.token_ids) for o in got] == want
    alone = [llm.generate(prompt_token_ids=[p], params=GREEDY, images=[i])[0].token_ids
             for p, i in zip(prompts, images)]
    assert [list(a) for a in alone] == want
    assert llm.backend.kv.num_free == LIMITS.max_batch


@pytest.mark.parametrize("layout", ["slot", "paged"])
def test_image_prompts_prefill_together_in_one_call(llava, hf, layout):
    """Short prompts admitted together share one prefill call (scheduling/prefill_groups.py), images and all: each
    row's features go in at its own positions, and every answer is transformers' and its own alone."""
    engine = llava[1] if layout == "slot" else llava[2]
    llm = LLM(engine, backend="onnxruntime", prefix_cache=False)
    text = [COMMON["bos_token_id"], *np.random.default_rng(24).integers(3, IMAGE_TOKEN, 24).tolist()]
    prompts, images = [prompt(21), prompt(22), text], [[png(20)], [png(21, size=(50, 40))], []]
    assert len({len(p) + (TOKENS - 1) * len(i) for p, i in zip(prompts, images)}) == 1  # rows of one width
    want = [hf_generate(hf, p, i) for p, i in zip(prompts, images)]
    got = llm.generate(prompt_token_ids=prompts, params=GREEDY, images=images)
    prefills = llm.generator.admission.prefills
    assert prefills.batched_calls >= 1 and prefills.batched_requests >= 2  # an image prompt shared a call
    assert [list(o.token_ids) for o in got] == want
    alone = [llm.generate(prompt_token_ids=[p], params=GREEDY, images=[i])[0].token_ids
             for p, i in zip(prompts, images)]
    assert [list(a) for a in alone] == want


def test_a_repeated_image_reuses_its_blocks_and_another_image_shares_none(llava, hf):
    llm = LLM(llava[1], backend="onnxruntime")
    cache = llm.generator.prefix_cache
    ids = prompt(5)
    first = llm.generate(prompt_token_ids=[ids], params=GREEDY, images=[png(20)])[0]
    hits = cache.stats().hit_tokens
    again = llm.generate(prompt_token_ids=[ids], params=GREEDY, images=[png(20)])[0]
    reused = cache.stats().hit_tokens - hits
    assert again.token_ids == first.token_ids and reused >= TOKENS  # the image's blocks came from the cache
    assert llm._image_prompts.encoder.images_encoded == 1  # and its features: the vision graph ran once
    other = llm.generate(prompt_token_ids=[ids], params=GREEDY, images=[png(21)])[0]
    assert cache.stats().hit_tokens - hits - reused < 5  # at most the text block before the image: no image KV
    assert list(other.token_ids) == hf_generate(hf, ids, [png(21)]) != list(first.token_ids)


def test_bad_image_requests_are_one_line_errors(llava, tiny_serve_engine):
    llm = LLM(llava[1], backend="onnxruntime")
    cases = [
        (dict(prompt_token_ids=[prompt(1)], images=[png(1), png(2)]), "1 image placeholder.* for 2 image"),
        (dict(prompt_token_ids=[prompt(1)]), "holds the image token .* but no image was given"),
        (dict(prompt_token_ids=[prompt(1)], images=[b"not a png"]), "not an image Pillow can read"),
        (dict(prompt_token_ids=[prompt(1)], images=["https://example.com/cat.png"]), "image URLs are not fetched"),
        (dict(prompt_token_ids=[prompt(1), prompt(2)], images=[[png(1)]]), "one list per prompt"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InputError, match=message) as info:
            llm.generate(params=GREEDY, **kwargs)
        assert "\n" not in str(info.value)
    assert llm.backend.kv.num_free == LIMITS.max_batch
    with pytest.raises(InputError, match="text-only engine; images need"):
        LLM(tiny_serve_engine).generate(prompt_token_ids=[[1, 5, 6]], params=GREEDY, images=[png(1)])


def test_run_with_images_and_chat_with_images(llava, hf, tmp_path):
    """`trtbuild run --image` (a prompt without an image token: the image goes first, after BOS) and LLM.chat with
    an image (an image token before the user's text): transformers' tokens for the same layout."""
    engine = llava[1]
    path = tmp_path / "cat.png"
    path.write_bytes(png(30))
    proc = trtbuild("run", engine, "--prompt", "w7 w8 w9", "--no-chat", "--image", path, "--max-new-tokens", "6",
                    "--temperature", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    llm = LLM(engine, backend="onnxruntime")
    text_ids = llm.encode("w7 w8 w9")
    at = 1 if text_ids[0] == COMMON["bos_token_id"] else 0
    want = hf_generate(hf, [*text_ids[:at], IMAGE_TOKEN, *text_ids[at:]], [png(30)], steps=6)
    assert out["token_ids"] == want
    assert_user_error(trtbuild("run", engine, "--prompt", "w7", "--image", tmp_path / "missing.png"),
                      "--image", "is not a file")
    # serve's image limits on run too: two images over a limit of one, an image over a byte limit (one line, exit 2)
    assert_user_error(trtbuild("run", engine, "--prompt", "w7", "--image", path, "--image", path,
                               "--limit-mm-per-prompt", '{"image": 1}'), "2 images", "at most 1")
    assert_user_error(trtbuild("run", engine, "--prompt", "w7", "--image", path, "--max-image-bytes", "100"),
                      "bytes")
    assert_user_error(trtbuild("run", engine, "--prompt", "w7", "--limit-mm-per-prompt", "{"), "--limit-mm-per-prompt")
    inspect = trtbuild("inspect", engine, "--json")
    assert "clip tower (2 layers" in json.loads(inspect.stdout)["vision"] and "16 tokens per image" in inspect.stdout
    on_torch = trtbuild("run", engine, "--prompt", "w7 w8 w9", "--no-chat", "--image", path, "--max-new-tokens", "6",
                        "--temperature", "0", "--json", "--backend", "torch")  # the CPU, float32
    assert on_torch.returncode == 0, on_torch.stderr
    assert json.loads(on_torch.stdout)["token_ids"] == want
    # chat: the template-less tiny tokenizer has no chat template, so give it one that keeps the content as is
    llm.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    got = llm.chat([{"role": "user", "content": "w7 w8"}], GREEDY, images=[png(31)])[0]
    ids = llm.encode_chat([{"role": "user", "content": "w300\nw7 w8"}])
    assert ids.count(IMAGE_TOKEN) == 1
    assert list(got.token_ids) == hf_generate(hf, ids, [png(31)])
