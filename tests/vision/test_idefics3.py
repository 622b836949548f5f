"""Idefics3 (SmolVLM): a tiny random Idefics3ForConditionalGeneration (tiny_idefics3.py) made in code, converted,
built for onnxruntime and run with images: its tower + pixel-shuffle connector against transformers'
get_image_features, the image splitting against Idefics3ImageProcessorPil, the prompt's tile grid against
Idefics3Processor's ids, and greedy tokens against transformers' generate on the processor's own inputs, alone and
batched with a text request, on the onnxruntime twin and the torch backend (CPU)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openai
import pytest
import torch
import transformers
from cli_process import trtbuild
from PIL import Image
from runner_engines import TINY_CHAT_TEMPLATE, add_word_tokenizer, build_engine
from safetensors import safe_open
from server.live_server import live_server  # tests/server/live_server.py (tests/ is on sys.path)
from tiny_idefics3 import (
    FAKE_TOKEN,
    GLOBAL_TOKEN,
    IMAGE_SIZE,
    IMAGE_TOKEN,
    LONGEST_EDGE,
    PREPROCESSOR,
    TOKENS_PER_TILE,
    idefics3_processor,
    tiny_idefics3,
)
from tiny_models import COMMON
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

from converters.archs.idefics3 import Idefics3Converter, image_processor, patch_position_ids, vision_spec
from converters.archs.llama import LlamaConverter
from converters.convert import convert
from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.formats.build_config import Limits
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.runner.vision.image_processor import preprocess_tiles
from engine_builder.runner.vision.images import ImageLimits, load_image
from engine_builder.runner.vision.tile_grid import TileTokens
from engine_builder.util.errors import ConfigError, InputError, UnsupportedError

LIMITS = Limits(max_batch=4, max_input_len=128, max_seq_len=160)
GREEDY = SamplingParams(max_new_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def idefics3(module_tmp_factory) -> tuple[Path, Path, Path]:
    """(HF dir, checkpoint, float32 onnxruntime engine)."""
    root = module_tmp_factory.mktemp("idefics3")
    hf_dir = tiny_idefics3(root / "hf")
    (hf_dir / "chat_template.jinja").write_text(TINY_CHAT_TEMPLATE)  # for serve's chat route
    result = convert(hf_dir, root / "ckpt", dtype="float32")
    assert list(result.dropped) == []  # every tensor read: the tower's post-norm, the connector, the text model
    return hf_dir, root / "ckpt", build_engine(root / "ckpt", root / "engine", LIMITS)


@pytest.fixture(scope="module")
def hf(idefics3):
    """transformers' model (EOS off: every step compared) and its processor over the same files."""
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        idefics3[0], dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None
    return model, idefics3_processor(idefics3[0])


def png(seed: int, size: tuple[int, int]) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def hf_generate(hf, text: str, images: list[bytes], steps: int = GREEDY.max_new_tokens) -> list[int]:
    """transformers' greedy tokens for TEXT with IMAGES laid out by Idefics3Processor (tiles, grid, pixels)."""
    model, processor = hf
    pil = [Image.open(io.BytesIO(b)) for b in images]
    inputs = processor(images=[pil] if pil else None, text=[text], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=steps, pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_vision_spec_and_tiling_from_the_hf_dir(idefics3):
    hf_dir, ckpt, _ = idefics3
    model = CheckpointConfig.load(ckpt).model  # saved and read back through config.json
    v = model.vision
    text = LlamaConverter.config_from_hf(json.loads((hf_dir / "config.json").read_text())["text_config"])
    assert model.architecture == "idefics3" and v is not None and (model.block, model.rope) == (text.block, text.rope)
    assert (v.tower, v.post_norm, v.projector, v.scale_factor, v.tokens_per_image, v.prompt_layout) == (
        "siglip", True, "pixel_shuffle", 2, TOKENS_PER_TILE, "tile_grid")
    assert (v.image_token_id, v.image_attention, v.image_start_token_id) == (IMAGE_TOKEN, "causal", None)
    p = v.processor
    assert (p.tiling.longest_edge, p.tiling.tile_size, p.tiling.split) == (LONGEST_EDGE, IMAGE_SIZE, True)
    assert (p.resample, p.image_mean, p.do_center_crop, p.output_size()) == (
        "lanczos", (0.5,) * 3, False, (IMAGE_SIZE, IMAGE_SIZE))
    assert v.max_image_tokens() >= 4 * (TOKENS_PER_TILE + 2) + TOKENS_PER_TILE + 3  # 2x2 tiles and the global one


def test_every_tensor_mapped(idefics3):
    hf_dir, ckpt, _ = idefics3
    with safe_open(hf_dir / "model.safetensors", "pt") as src, safe_open(ckpt / "rank0.safetensors", "pt") as out:
        assert set(out.keys()) == set(expected_shapes(CheckpointConfig.load(ckpt).model))
        torch.testing.assert_close(out.get_tensor("vision.projector.proj.weight"),
                                   src.get_tensor("model.connector.modality_projection.proj.weight"), rtol=0, atol=0)


@pytest.mark.parametrize("side", [4, 19, 25, 32, 38])
def test_patch_positions_are_transformers_bucketized_ones(side):
    """Idefics3VisionEmbeddings' position of each patch of a full image (not its index for sides 19, 25, 38):
    the positions its embedding adds to a zero patch embedding."""
    config = transformers.Idefics3VisionConfig(hidden_size=4, image_size=side, patch_size=1)
    embeddings = Idefics3VisionEmbeddings(config).eval()
    with torch.no_grad():
        embeddings.patch_embedding.weight.zero_()
        embeddings.patch_embedding.bias.zero_()
        embeddings.position_embedding.weight.copy_(torch.arange(side * side)[:, None].float().expand(-1, 4))
        added = embeddings(torch.zeros(1, 3, side, side), torch.ones(1, side, side, dtype=torch.bool))
    assert added[0, :, 0].long().tolist() == patch_position_ids(side)
    assert (patch_position_ids(side) == list(range(side * side))) == (side in (4, 32))


def test_vision_features_match_transformers(idefics3, hf):
    """vision.onnx (SigLIP tower, post-norm, pixel shuffle, projection) vs get_image_features on 3 tiles."""
    _, ckpt, engine = idefics3
    pixels = np.random.default_rng(3).standard_normal((3, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    got = ort.InferenceSession(str(engine / "vision.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"pixel_values": pixels})[0]
    with torch.no_grad():
        want = hf[0].model.get_image_features(torch.from_numpy(pixels)[None]).pooler_output[0].numpy()
    want = want.reshape(3, TOKENS_PER_TILE, COMMON["hidden_size"])
    assert got.shape == want.shape and np.abs(want).max() > 0.5 and np.abs(want[0] - want[1]).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


# (width, height, mode): 2x2 tiles, 2x1 (portrait, RGBA), upscaled greyscale, one square, 1x2 panorama
IMAGES = [(64, 40, "RGB"), (33, 71, "RGBA"), (20, 12, "L"), (100, 31, "RGB"), (31, 100, "RGB")]


@pytest.mark.parametrize("split, longest, resize", [
    (True, LONGEST_EDGE, True), (True, 3 * IMAGE_SIZE, True), (False, LONGEST_EDGE, True), (True, IMAGE_SIZE, True),
    (True, LONGEST_EDGE, False)])  # the last: each image tiled at its own size (up to 4x4 here)
def test_tiles_equal_idefics3s_image_processor(split, longest, resize):
    """The converted spec through the runtime's splitting vs Idefics3ImageProcessorPil (what transformers uses
    without torchvision) from the same config: the tiles, then the global image, every pixel within 1e-6."""
    config = {**{k: v for k, v in PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")},
              "do_image_splitting": split, "size": {"longest_edge": longest}, "do_resize": resize}
    processor, spec = Idefics3ImageProcessorPil(**config), image_processor(config, IMAGE_SIZE)
    for i, (width, height, mode) in enumerate(IMAGES):
        bands = len(Image.new(mode, (1, 1)).getbands())
        pixels = np.random.default_rng(i).integers(0, 256, (height, width, bands), np.uint8)
        image = Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode)
        want = processor(images=[[image]], return_tensors="np", return_row_col_info=True)
        got, grid = preprocess_tiles(load_image(image, ImageLimits()), spec)
        assert grid == (want["rows"][0][0], want["cols"][0][0]), (width, height)
        assert got.dtype == np.float32 and got.shape == want["pixel_values"][0].shape, (width, height)
        np.testing.assert_allclose(got, want["pixel_values"][0], rtol=0, atol=1e-6, err_msg=f"{width}x{height}")


def test_the_prompt_is_laid_out_as_idefics3s_processor_does(idefics3, hf):
    """Two images of different grids in one prompt: the runtime's ids (tile grid from the tokenizer) are exactly
    Idefics3Processor's, text layout and "\\n\\n" merge included."""
    _, _, engine = idefics3
    text, images = "w5 w6 <image> w7 <image> w8", [png(1, (64, 40)), png(2, (31, 100))]
    want = hf[1](images=[[Image.open(io.BytesIO(b)) for b in images]], text=[text])["input_ids"][0]
    with LLM(engine, backend="onnxruntime") as llm:
        got = llm._with_images([llm.encode(text)], [images])[1][0]
    assert got.ids == want and want.count(GLOBAL_TOKEN) == 2 and want.count(FAKE_TOKEN) == 2 * 2 + 2 * 1 + 2 * 2
    assert len(got.positions) == len(got.embeds) == (5 + 3) * TOKENS_PER_TILE  # 2x2 + 1, 2x1 + 1 tiles


def test_images_alone_and_beside_text_equal_transformers(idefics3, hf):
    _, _, engine = idefics3
    prompts = ["w5 w6 <image> w7", "w9 w10 w11 w12", "w13 <image> w14 <image> w15"]
    images = [[png(10, (64, 40))], [], [png(11, (30, 30)), png(12, (33, 71))]]
    want = [hf_generate(hf, p, i) for p, i in zip(prompts, images)]
    assert len({tuple(w) for w in want}) == 3 and all(len(set(w)) > 2 for w in want)
    with LLM(engine, backend="onnxruntime") as llm:
        assert [list(o.token_ids) for o in llm.generate(prompts, GREEDY, images=images)] == want
        alone = [llm.generate(p, GREEDY, images=i)[0].token_ids for p, i in zip(prompts, images)]
        assert [list(a) for a in alone] == want
        # 2x2 tiles + the global image, twice (a small square is upscaled to 64 px first), 2x1 + global: each
        # encoded once, the calls alone reusing the features
        assert llm._image_prompts.encoder.images_encoded == 5 + 5 + 3
        other = [png(13, (64, 40))]  # another image, the same prompt: another answer, transformers' too
        assert list(llm.generate(prompts[0], GREEDY, images=other)[0].token_ids) == hf_generate(hf, prompts[0],
                                                                                                other) != want[0]
    with LLM(engine, backend="torch") as llm:  # the CPU, float32
        assert [list(o.token_ids) for o in llm.generate(prompts, GREEDY, images=images)] == want


def test_a_chunked_prefill_splits_the_tiles_and_answers_as_transformers(idefics3, hf):
    """Idefics3's image tokens are causal (transformers' llama mask): under a 5-token step budget the executor's
    chunks end inside tiles, each chunk taking its own slice of the features, and the answer is transformers'."""
    _, _, engine = idefics3
    text, image = "w5 w6 <image> w7", png(40, (64, 40))
    with LLM(engine, backend="onnxruntime", prefix_cache=False) as llm:
        prepared = llm._with_images([llm.encode(text)], [[image]])[1][0]
        assert not prepared.whole and prepared.chunk_end(0, 7) == 7  # any end will do
        with Executor(llm, SchedulerConfig(max_tokens_per_step=5)) as executor:
            long = SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)
            other = executor.submit(llm.encode("w9 w10 w11"), long)
            next(other.events(timeout=60))  # the image request arrives while the text one decodes: chunked prefill
            got = executor.submit(prepared.ids, GREEDY, prepared).result(timeout=120)
            other.result(timeout=120)
            assert executor.stats().chunked_prefill_steps > 0
    assert list(got.token_ids) == hf_generate(hf, text, [image])


def test_run_with_an_image_and_inspect(idefics3, hf, tmp_path):
    """`trtbuild run --image` on a prompt holding <image>: transformers' tokens; inspect names the tiles."""
    _, _, engine = idefics3
    path = tmp_path / "cat.png"
    path.write_bytes(png(30, (50, 64)))
    proc = trtbuild("run", engine, "--prompt", "w7 <image> w8", "--no-chat", "--image", path, "--max-new-tokens", "6",
                    "--temperature", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["token_ids"] == hf_generate(hf, "w7 <image> w8", [png(30, (50, 64))], steps=6)
    shown = json.loads(trtbuild("inspect", engine, "--json").stdout)["vision"]
    assert f"{TOKENS_PER_TILE} tokens per tile" in shown and f"resized to {LONGEST_EDGE} px" in shown


def test_served_openai_chat_with_an_image_part_equals_transformers(idefics3, hf):
    """`trtbuild serve` and the OpenAI client with a base64 image part: the server writes the image token and a
    newline where the part is; the answer is transformers' on Idefics3Processor's layout of that text."""
    _, _, engine = idefics3
    image = png(50, (40, 64))
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    with live_server(engine) as server, LLM(engine, backend="onnxruntime") as llm:
        answer = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none").chat.completions.create(
            model="engine", max_tokens=6, temperature=0, messages=[{"role": "user", "content": [
                {"type": "text", "text": "w7 w8 "}, {"type": "image_url", "image_url": {"url": url}}]}])
        text = llm.apply_chat_template([{"role": "user", "content": "w7 w8 <image>\n"}])
        # the answer's text leaves out special tokens (the random model emits some, e.g. <row_3_col_6>)
        want = llm.tokenizer.decode(hf_generate(hf, text, [image], steps=6), skip_special_tokens=True)
    assert answer.choices[0].message.content.split() == want.split() and len(want.split()) >= 3


def test_a_tokenizer_without_the_tile_tokens_is_refused(tmp_path):
    """The grid's ids come from the engine's tokenizer: one without <fake_token_around_image> is a one-line error."""
    add_word_tokenizer(tmp_path, COMMON["vocab_size"])
    with pytest.raises(UnsupportedError, match="no <fake_token_around_image> token.*own tokenizer files") as info:
        TileTokens.from_tokenizer(transformers.PreTrainedTokenizerFast.from_pretrained(tmp_path))
    assert "\n" not in str(info.value)


def test_a_checkpoint_without_its_processor_config_is_refused(idefics3, tmp_path):
    hf_dir, _, _ = idefics3
    bare = Path(shutil.copytree(hf_dir, tmp_path / "hf"))
    (bare / "preprocessor_config.json").unlink()
    with pytest.raises(InputError, match="no preprocessor_config.json .* copy it from the model's repository") as e:
        convert(bare, tmp_path / "ckpt", dtype="float32")
    assert "\n" not in str(e.value) and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("change, error, words", [
    (dict(scale_factor=3), UnsupportedError, "does not divide the 4x4 patch grid"),
    (dict(vision_config=dict(model_type="siglip_vision_model")), UnsupportedError, "'siglip_vision_model' vision"),
    (dict(text_config=dict(model_type="qwen2")), UnsupportedError, "'qwen2' text model"),
    (dict(image_token_id=400), ConfigError, "image_token_id 400 is outside the vocabulary"),
])
def test_configs_the_graph_cannot_take_are_refused_in_one_line(idefics3, change, error, words):
    hf = json.loads((idefics3[0] / "config.json").read_text())
    for key, value in change.items():
        hf[key] = {**hf[key], **value} if isinstance(value, dict) else value
    with pytest.raises(error) as info:
        Idefics3Converter.config_from_hf(hf).validate()
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("change, error, words", [
    (dict(max_image_size={"longest_edge": 48}), UnsupportedError, "max_image_size 48 is not the vision tower's"),
    (dict(size={"height": 64, "width": 64}), InputError, "are not {'longest_edge': N}"),
    (dict(size={"longest_edge": 7 * IMAGE_SIZE}), ConfigError, "7 tiles of 32 px a side, above the 6"),
])
def test_processor_configs_that_do_not_fit_are_refused_in_one_line(idefics3, change, error, words):
    hf = json.loads((idefics3[0] / "config.json").read_text())
    with pytest.raises(error) as info:
        vision_spec(hf, {**PREPROCESSOR, **change}).validate(COMMON["vocab_size"])
    assert words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InputError, match="image_seq_len 5 is not the 4 tokens a tile makes"):
        vision_spec(hf, PREPROCESSOR, 5)


# HuggingFaceTB/SmolVLM-256M-Instruct's config.json as transformers 4 saved it (the keys read here) and its
# preprocessor_config.json / processor_config.json
SMOLVLM_256M = {
    "architectures": ["Idefics3ForConditionalGeneration"], "image_token_id": 49190, "model_type": "idefics3",
    "scale_factor": 4, "tie_word_embeddings": False, "transformers_version": "4.50.0.dev0",
    "text_config": {"head_dim": 64, "hidden_size": 576, "intermediate_size": 1536, "max_position_embeddings": 8192,
                    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
                    "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_theta": 100000,
                    "tie_word_embeddings": False, "vocab_size": 49280},
    "vision_config": {"hidden_size": 768, "image_size": 512, "intermediate_size": 3072,
                      "model_type": "idefics3_vision", "num_attention_heads": 12, "num_hidden_layers": 12,
                      "patch_size": 16},
}
SMOLVLM_PROCESSOR = {"do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
                     "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
                     "image_processor_type": "Idefics3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
                     "max_image_size": {"longest_edge": 512}, "processor_class": "Idefics3Processor",
                     "resample": 1, "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 2048}}


def test_smolvlm_256ms_config_reads_as_transformers_reads_it():
    """SmolVLM-256M's shape: 64 tokens per 512 px tile (a 32x32 patch grid shuffled by 4), up to 4x4 tiles."""
    cfg = dataclasses.replace(Idefics3Converter.config_from_hf(SMOLVLM_256M),
                              vision=vision_spec(SMOLVLM_256M, SMOLVLM_PROCESSOR, 64))
    cfg.validate()
    hf = transformers.Idefics3Config.from_dict(SMOLVLM_256M)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (
        576, 30, 9, 3, 49280)
    v = cfg.vision
    assert v.tokens_per_image == int((hf.vision_config.image_size // hf.vision_config.patch_size) ** 2
                                     / hf.scale_factor ** 2) == 64
    assert (v.processor.tiling.max_tiles_per_side(), v.max_image_tokens()) == (4, 17 * 66 + 6)
    assert v.processor.resample == "lanczos" and not cfg.tie_word_embeddings


# SmolVLM's chat template (its tokenizer_config.json and chat_template.json): content read as typed parts only
SMOLVLM_TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content']"
                    "[0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}"
                    "{% if line['type'] == 'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}"
                    "{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}"
                    "{{ 'Assistant:' }}{% endif %}")


def test_chat_with_smolvlms_template_lays_out_parts_as_transformers_does(idefics3, hf, tmp_path):
    """A template that iterates content parts: chat() hands it the turn as [image, text] parts (a string would
    render an empty turn), so the prompt and the answer are transformers' for the same parts."""
    _, _, engine = idefics3
    copy = tmp_path / "engine"
    shutil.copytree(engine, copy)
    (copy / "chat_template.jinja").write_text(SMOLVLM_TEMPLATE)
    image = png(60, (64, 40))
    turns = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "w7 w8"}]}]
    text = hf[1].tokenizer.apply_chat_template(turns, chat_template=SMOLVLM_TEMPLATE, tokenize=False,
                                               add_generation_prompt=True)
    assert text == "<|im_start|>User:<image>w7 w8<end_of_utterance>\nAssistant:"
    with LLM(copy, backend="onnxruntime", verify=False) as llm:
        messages = [{"role": "user", "content": "w7 w8"}]
        assert llm.apply_chat_template(llm._image_turn(messages, [image])) == text
        got = llm.chat(messages, GREEDY, images=[image])[0]
    assert list(got.token_ids) == hf_generate(hf, text, [image])
