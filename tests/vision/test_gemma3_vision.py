"""Gemma 3: a tiny random Gemma3ForConditionalGeneration (SigLIP tower, 2 layers; tiny gemma3 text model) made in
code, converted; the vision graph's features (tower, post-norm, pooled grid, (1 + w) RMSNorm, projection) against
transformers' get_image_features, and the built text decoder's greedy tokens against transformers' generate on a
text-only prompt."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from hf_greedy import assert_greedy_equals_hf
from PIL import Image
from runner_engines import build_engine
from safetensors import safe_open
from safetensors.torch import save_file
from test_llava_splice import SlotSession  # model.onnx fed as runner/ort_backend.py binds it, plus the splice
from tiny_gemma3 import (
    BOI_TOKEN,
    EOI_TOKEN,
    IMAGE_SIZE,
    IMAGE_TOKEN,
    PATCH,
    PREPROCESSOR,
    TOKENS_PER_IMAGE,
    tiny_gemma3,
)
from tiny_models import COMMON
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

from converters.archs.gemma3 import Gemma3Converter, Gemma3TextConverter, image_processor
from converters.convert import convert
from engine_builder import LLM, SamplingParams
from engine_builder.build.pipeline import build
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig, expected_shapes
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.vision_spec import VISION_MODEL
from engine_builder.network.vision_encoder import write_vision_onnx
from engine_builder.runner.vision.image_processor import preprocess
from engine_builder.runner.vision.images import ImageLimits, load_image
from engine_builder.util.errors import ConfigError, UnsupportedError

STEPS = 16


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gemma3")
    hf_dir = tiny_gemma3(root / "hf")
    result = convert(hf_dir, root / "ckpt", dtype="float32")
    assert list(result.dropped) == []  # every tensor kept: the tower's post-norm is read, Gemma 3 has no head
    return hf_dir, root / "ckpt"


def _hf(hf_dir: Path) -> transformers.Gemma3ForConditionalGeneration:
    return transformers.Gemma3ForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()


def test_vision_spec_and_processor_from_the_hf_dir(gemma3):
    hf_dir, ckpt = gemma3
    model = CheckpointConfig.load(ckpt).model  # saved and read back through config.json
    v = model.vision
    assert model.architecture == "gemma3" and v is not None
    assert (v.tower, v.hidden_size, v.intermediate_size, v.num_layers, v.num_heads, v.patch_size, v.image_size) == (
        "siglip", 32, 48, 2, 4, PATCH, IMAGE_SIZE)
    assert (v.activation, v.layer_norm_eps, v.post_norm, v.projector, v.feature_layers) == (
        "gelu_tanh", 1e-6, True, "pool_norm", (-1,))
    assert (v.image_token_id, v.tokens_per_image, v.image_start_token_id, v.image_end_token_id) == (
        IMAGE_TOKEN, TOKENS_PER_IMAGE, BOI_TOKEN, EOI_TOKEN)
    assert v.image_attention == "bidirectional"
    p = v.processor
    assert (p.do_resize, p.height, p.width, p.shortest_edge, p.do_center_crop, p.resample) == (
        True, IMAGE_SIZE, IMAGE_SIZE, None, False, "bilinear")
    assert (p.do_convert_rgb, p.image_mean, p.image_std, p.rescale_factor) == (True, (0.5,) * 3, (0.5,) * 3, 1 / 255)
    # the text decoder is gemma3_text's, unchanged
    hf = transformers.Gemma3Config.from_pretrained(hf_dir)
    text = Gemma3TextConverter.config_from_hf(hf.text_config.to_dict())
    assert (model.block, model.rope, model.hidden_size, model.vocab_size) == (
        text.block, text.rope, COMMON["hidden_size"], COMMON["vocab_size"])


def test_every_tensor_mapped_and_the_projection_transposed(gemma3):
    hf_dir, ckpt = gemma3
    with safe_open(hf_dir / "model.safetensors", "pt") as src, safe_open(ckpt / "rank0.safetensors", "pt") as out:
        names = set(out.keys())
        assert {n for n in names if n.startswith("vision.")} == {
            n for n in expected_shapes(CheckpointConfig.load(ckpt).model) if n.startswith("vision.")}
        assert "vision.embed.class" not in names and "vision.pre_norm.weight" not in names  # SigLIP has neither
        torch.testing.assert_close(out.get_tensor("vision.projector.proj.weight"),
                                   src.get_tensor("multi_modal_projector.mm_input_projection_weight").t(),
                                   rtol=0, atol=0)
        want = torch.cat([src.get_tensor(f"vision_tower.encoder.layers.1.self_attn.{n}_proj.weight") for n in "qkv"])
        torch.testing.assert_close(out.get_tensor("vision.layers.1.attn.qkv.weight"), want, rtol=0, atol=0)


def test_vision_features_match_transformers(gemma3, tmp_path):
    """The vision graph on onnxruntime vs get_image_features (SigLIP's last_hidden_state through the projector)."""
    hf_dir, ckpt = gemma3
    path = write_vision_onnx(ckpt, tmp_path / "vision")
    pixels = np.random.default_rng(3).standard_normal((3, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)  # 3 images
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": pixels})[0]
    with torch.no_grad():
        want = _hf(hf_dir).get_image_features(torch.from_numpy(pixels)).pooler_output.numpy()
    assert got.shape == want.shape == (3, TOKENS_PER_IMAGE, COMMON["hidden_size"])
    assert np.abs(want).max() > 0.5  # features of a real size, where a wrong norm or pooling shows
    assert np.abs(want[0] - want[1]).max() > 0.1  # and different images give different features
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_text_only_greedy_generation_matches_transformers(gemma3, tmp_path):
    hf_dir, ckpt = gemma3
    engine = tmp_path / "engine"
    build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                    limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))
    assert EngineManifest.load(engine).model.vision == CheckpointConfig.load(ckpt).model.vision
    prompt = np.random.default_rng(7).integers(3, BOI_TOKEN, 20).tolist()  # no image tokens
    hf = _hf(hf_dir)
    assert_greedy_equals_hf(hf, engine, prompt, STEPS)


@pytest.mark.parametrize("change, error, words", [
    (dict(mm_tokens_per_image=8), UnsupportedError, "not a square"),
    (dict(mm_tokens_per_image=9), UnsupportedError, "divides the 4x4 patch grid"),
    (dict(vision_config=dict(model_type="clip_vision_model")), UnsupportedError, "'clip_vision_model' vision tower"),
    (dict(vision_config=dict(hidden_act="tanh")), UnsupportedError, "hidden_act 'tanh'"),
    (dict(vision_config=dict(image_size=[56, 28])), UnsupportedError, "only square images"),
    (dict(image_token_index=400), ConfigError, "image_token_id 400 is outside the vocabulary"),
])
def test_configs_the_graph_cannot_take_are_refused_in_one_line(gemma3, change, error, words):
    hf_dir, _ = gemma3
    hf = transformers.Gemma3Config.from_pretrained(hf_dir).to_dict()
    for key, value in change.items():
        hf[key] = {**hf[key], **value} if isinstance(value, dict) else value
    with pytest.raises(error) as info:
        Gemma3Converter.config_from_hf(hf).validate()
    assert words in str(info.value) and "\n" not in str(info.value)


def test_pan_and_scan_is_refused():
    with pytest.raises(UnsupportedError, match="do_pan_and_scan"):
        image_processor({"do_pan_and_scan": True}, IMAGE_SIZE)


# google/gemma-3-4b-it's config.json as transformers 4 saved it: text_config and vision_config as diffs against
# their classes (no heads, head_dim or rope bases in text_config)
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def test_a_transformers_4_config_reads_as_transformers_reads_it():
    """Gemma 3 4B's diffed config.json: the text model as transformers fills it in (its defaults for the heads,
    head_dim, rope bases), the SigLIP So400m tower pooled 64x64 -> 16x16."""
    cfg = Gemma3Converter.config_from_hf(GEMMA3_4B)
    cfg.validate()
    hf = transformers.Gemma3Config.from_dict(GEMMA3_4B)
    text = Gemma3TextConverter.config_from_hf(hf.text_config.to_dict())
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers, cfg.vocab_size) == (8, 4, 256, 34, 262208)
    assert (cfg.block, cfg.rope, cfg.embedding_multiplier) == (text.block, text.rope, text.embedding_multiplier)
    assert (cfg.rope.theta, cfg.rope.local_theta, cfg.rope.scaling.factor) == (1e6, 1e4, 8.0)
    v = cfg.vision
    assert (v.hidden_size, v.num_layers, v.image_size, v.patch_size, v.tokens_per_image, v.pool_kernel) == (
        1152, 27, 896, 14, 256, 4)
    assert (v.image_token_id, v.image_start_token_id, v.image_end_token_id) == (262144, 255999, 256000)


@pytest.mark.parametrize("width, height, mode", [(64, 40, "RGB"), (33, 71, "RGBA"), (45, 30, "L")])
def test_runtime_pixels_equal_gemma3s_image_processor(gemma3, width, height, mode):
    """The converted processor spec through the runtime's preprocessing vs transformers' Gemma3ImageProcessorPil
    from the same preprocessor_config.json: a resize to exactly the tower's size, no crop, mean / std 0.5."""
    _, ckpt = gemma3
    rng = np.random.default_rng(width)
    bands = len(Image.new(mode, (1, 1)).getbands())
    pixels = rng.integers(0, 256, (height, width, bands), np.uint8)
    image = Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode)
    hf = Gemma3ImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if v is not None and k not in (
        "image_processor_type", "processor_class", "image_seq_length")})
    want = hf(images=image, return_tensors="np")["pixel_values"][0]
    got = preprocess(load_image(image, ImageLimits()), CheckpointConfig.load(ckpt).model.vision.processor)
    assert got.shape == want.shape == (3, IMAGE_SIZE, IMAGE_SIZE)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# what transformers 5 saves -> the hub's transformers 4 names (google/gemma-3-*), and transformers 5's module names
RENAMES = {
    "hub": lambda n: n.replace("vision_tower.", "vision_tower.vision_model.", 1),
    "modules": lambda n: (n.replace("language_model.model.", "model.language_model.", 1)
                          .replace("vision_tower.", "model.vision_tower.", 1)
                          .replace("multi_modal_projector.", "model.multi_modal_projector.", 1)),
}


@pytest.mark.parametrize("spelling", sorted(RENAMES))
def test_every_spelling_of_the_names_converts_alike(gemma3, tmp_path, spelling):
    hf_dir, ckpt = gemma3
    src = tmp_path / "hf"
    src.mkdir()
    with safe_open(hf_dir / "model.safetensors", "pt") as f:
        renamed = {RENAMES[spelling](n): f.get_tensor(n) for n in f.keys()}
    save_file(renamed, str(src / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"):
        (src / name).write_bytes((hf_dir / name).read_bytes())
    convert(src, tmp_path / "ckpt", dtype="float32")
    with safe_open(ckpt / "rank0.safetensors", "pt") as want, safe_open(tmp_path / "ckpt" / "rank0.safetensors",
                                                                      "pt") as got:
        assert set(got.keys()) == set(want.keys())
        assert all(torch.equal(got.get_tensor(n), want.get_tensor(n)) for n in want.keys())


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_vision_graph_builds_with_tensorrt_rtx(gemma3, tmp_path, dtype):
    """A real TensorRT-RTX build (sm80/sm86, no GPU needed) with a profile over 1..4 images per call: every op a
    native layer (the patch convolution, the grid's average pool)."""
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    from engine_builder.network.options import NetworkOptions
    from engine_builder.trt.engine_build import TrtBuildOptions, build_engine

    _, ckpt = gemma3
    path = write_vision_onnx(ckpt, tmp_path, NetworkOptions(dtype=dtype))
    shape = (3, IMAGE_SIZE, IMAGE_SIZE)
    report = build_engine(path, tmp_path / "vision.engine", TrtBuildOptions(
        compute_capabilities=("sm80", "sm86"), profiles=({"pixel_values": ((1, *shape), (1, *shape), (4, *shape))},),
        decomposable_attention=dtype == "float32"))
    assert report.engine_path.is_file() and report.engine_bytes > 0
    layers = report.network_layer_types
    # both layers computed: their 4 LayerNorms and the post-norm; one softmax per layer
    assert (layers["CONVOLUTION"], layers["POOLING"], layers["NORMALIZATION"], layers["SOFTMAX"]) == (1, 1, 5, 2)


def image_prompt(seed: int) -> list[int]:
    """[bos, text..., boi, image_token_id * TOKENS_PER_IMAGE, eoi, text...], as Gemma3Processor lays an image out."""
    text = np.random.default_rng(seed).integers(3, BOI_TOKEN, 12).tolist()
    return [COMMON["bos_token_id"], *text[:5], BOI_TOKEN, *[IMAGE_TOKEN] * TOKENS_PER_IMAGE, EOI_TOKEN, *text[5:]]


@pytest.fixture(scope="module")
def spliced_engine(gemma3, module_tmp_factory) -> Path:
    _, ckpt = gemma3
    return build_engine(ckpt, module_tmp_factory.mktemp("gemma3-splice") / "engine",
                        Limits(max_batch=2, max_input_len=48, max_seq_len=64))


def _features_and_session(engine: Path, prompt: list[int], seed: int):
    """vision.onnx's features of one random image, the decoder's image_embeds / image_mask for PROMPT, a session."""
    pixel_values = np.random.default_rng(seed).standard_normal((1, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    vision = ort.InferenceSession(str(engine / VISION_MODEL), providers=["CPUExecutionProvider"])
    features = vision.run(None, {"pixel_values": pixel_values})[0]
    ids = np.array([prompt])
    mask = ids == IMAGE_TOKEN
    embeds = np.zeros((*ids.shape, COMMON["hidden_size"]), np.float32)
    embeds[mask] = features.reshape(-1, COMMON["hidden_size"])
    return pixel_values, (ids, embeds, mask), SlotSession(engine, rows=1)


def test_image_prefill_and_greedy_tokens_equal_transformers(gemma3, spliced_engine):
    """The decoder's splice (features after the sqrt(hidden) embedding scale, unscaled, as Gemma3Model's
    masked_scatter) with vision.onnx's features, an image's tokens attending to each other both ways: the prefill
    logits and greedy tokens of transformers given Gemma3Processor's token_type_ids."""
    hf_dir, _ = gemma3
    prompt = image_prompt(1)
    pixel_values, inputs, session = _features_and_session(spliced_engine, prompt, 3)
    hf = _hf(hf_dir)
    hf.generation_config.eos_token_id = None
    logits = session.step(*inputs)
    with torch.no_grad():
        types = torch.from_numpy(inputs[2].astype(np.int64))  # 1 at the image's tokens
        want = hf(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values),
                  token_type_ids=types).logits[0, -1]
        causal = hf(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values)).logits[0, -1]
        blind = hf(input_ids=torch.tensor([prompt]).clamp(max=BOI_TOKEN - 1)).logits[0, -1]
        want_tokens = hf.generate(torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values),
                                  token_type_ids=types, do_sample=False, max_new_tokens=STEPS,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    assert float((want - blind).abs().max()) > 0.5  # the image changes the answer
    assert float((want - causal).abs().max()) > 0.01  # and attending both ways within it does too
    np.testing.assert_allclose(logits[0], want.numpy(), rtol=0, atol=2e-5)
    got = []
    for _ in range(STEPS):
        got.append(int(logits[0].argmax()))
        logits = session.step(np.array([[got[-1]]]), np.zeros((1, 1, COMMON["hidden_size"]), np.float32),
                              np.zeros((1, 1), bool))
    assert got == want_tokens
    assert len(set(want_tokens)) > STEPS // 2


def test_image_and_text_requests_through_llm_generate_equal_transformers(gemma3, spliced_engine):
    """The runtime's pipeline (a PNG through Pillow, the converted processor spec, vision.onnx, the splice) in one
    generate beside a text request, against transformers' generate on pixels Gemma3ImageProcessorPil makes from the
    same PNG; the prompt laid out as Gemma3Processor does (boi, the image tokens, eoi), with its token_type_ids."""
    hf_dir, _ = gemma3
    source = np.random.default_rng(20).integers(0, 256, (40, 48, 3), np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(source).save(buffer, "PNG")
    image, text = image_prompt(5), np.random.default_rng(6).integers(3, BOI_TOKEN, 15).tolist()
    processor = Gemma3ImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if v is not None and k not in (
        "image_processor_type", "processor_class", "image_seq_length")})
    pixel_values = processor(Image.open(io.BytesIO(buffer.getvalue())), return_tensors="pt")["pixel_values"]
    hf = _hf(hf_dir)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        want = [hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=STEPS, pad_token_id=0,
                            **kwargs)[0, len(ids):].tolist()
                for ids, kwargs in ((image, {"pixel_values": pixel_values,
                                             "token_type_ids": torch.tensor([[int(t == IMAGE_TOKEN) for t in image]])}),
                                    (text, {}))]
        blind = hf.generate(torch.tensor([image]).clamp(max=BOI_TOKEN - 1), do_sample=False, max_new_tokens=STEPS,
                            pad_token_id=0)[0, len(image):].tolist()
    assert want[0] != blind  # the image changes the answer
    with LLM(spliced_engine, backend="onnxruntime") as llm:
        got = llm.generate(prompt_token_ids=[image, text], images=[[buffer.getvalue()], []],
                           params=SamplingParams(temperature=0, max_new_tokens=STEPS, ignore_eos=True))
    assert [list(o.token_ids) for o in got] == want


def test_a_chunked_prefill_never_ends_inside_an_image(gemma3, spliced_engine):
    """The decoder sees an image's both-ways attention among one call's tokens only: under a 3-token step budget the
    executor's chunks stop before the image or run through it, and the answer is LLM.generate's (one call)."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(7).integers(0, 256, (40, 48, 3), np.uint8)).save(buffer, "PNG")
    prompt, params = image_prompt(8), SamplingParams(temperature=0, max_new_tokens=STEPS, ignore_eos=True)
    with LLM(spliced_engine, backend="onnxruntime", prefix_cache=False) as llm:
        want = llm.generate(prompt_token_ids=[prompt], params=params, images=[buffer.getvalue()])[0].token_ids
        image = llm._image_prompts.prepare(prompt, [buffer.getvalue()])
        first = int(image.positions[0])
        assert [image.chunk_end(0, e) for e in (first, first + 1, first + 3)] == [first, first, first]
        assert image.chunk_end(first, first + 1) == first + TOKENS_PER_IMAGE
        with Executor(llm, SchedulerConfig(max_tokens_per_step=3)) as executor:
            long = SamplingParams(temperature=0, max_new_tokens=55, ignore_eos=True)
            text = executor.submit(np.random.default_rng(9).integers(3, BOI_TOKEN, 5).tolist(), long)
            next(text.events(timeout=60))  # the image request arrives while the text one decodes: chunked prefill
            got = executor.submit(image.ids, params, image).result(timeout=120)
            text.result(timeout=120)
            assert executor.stats().chunked_prefill_steps > 0
    assert got.token_ids == want


def test_a_start_of_image_token_is_laid_out_as_gemma3s_processor_does(gemma3, spliced_engine):
    """A prompt holding <start_of_image> where the image goes (what Gemma 3's chat template writes) becomes boi, the
    image tokens, eoi (with the tokenizer's "\n\n" either side: none in the word tokenizer), and answers as the laid
    out prompt does; a prompt with none gets that layout first."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(11).integers(0, 256, (40, 48, 3), np.uint8)).save(buffer, "PNG")
    laid_out = image_prompt(12)
    at = laid_out.index(BOI_TOKEN)
    short = [*laid_out[:at + 1], *laid_out[at + 2 + TOKENS_PER_IMAGE:]]  # boi only
    params = SamplingParams(temperature=0, max_new_tokens=STEPS, ignore_eos=True)
    with LLM(spliced_engine, backend="onnxruntime") as llm:
        want = llm.generate(prompt_token_ids=[laid_out], params=params, images=[buffer.getvalue()])[0].token_ids
        assert llm.generate(prompt_token_ids=[short], params=params, images=[buffer.getvalue()])[0].token_ids == want
        image = llm._image_prompts.prepare([COMMON["bos_token_id"], 5, 6], [buffer.getvalue()])
        assert image.ids == [COMMON["bos_token_id"], BOI_TOKEN, *[IMAGE_TOKEN] * TOKENS_PER_IMAGE, EOI_TOKEN, 5, 6]


def test_prompt_logprobs_score_an_image_prompt_without_splitting_the_image(gemma3, spliced_engine):
    """prompt_logprobs run in calls of logits_tail (16) tokens; an image crossing position 16 goes whole into the
    next call (its tokens attend both ways), so every prompt token's logprob is transformers' given token_type_ids."""
    hf_dir, _ = gemma3
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(11).integers(0, 256, (40, 48, 3), np.uint8)).save(buffer, "PNG")
    text = np.random.default_rng(12).integers(3, BOI_TOKEN, 18).tolist()
    prompt = [COMMON["bos_token_id"], *text[:13], BOI_TOKEN, *[IMAGE_TOKEN] * TOKENS_PER_IMAGE, EOI_TOKEN, *text[13:]]
    assert prompt.index(IMAGE_TOKEN) < 16 < prompt.index(IMAGE_TOKEN) + TOKENS_PER_IMAGE
    processor = Gemma3ImageProcessorPil(**{k: v for k, v in PREPROCESSOR.items() if v is not None and k not in (
        "image_processor_type", "processor_class", "image_seq_length")})
    pixel_values = processor(Image.open(io.BytesIO(buffer.getvalue())), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = _hf(hf_dir)(input_ids=torch.tensor([prompt]), pixel_values=pixel_values,
                             token_type_ids=torch.tensor([[int(t == IMAGE_TOKEN) for t in prompt]])).logits[0]
    want = torch.log_softmax(logits.double(), -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].numpy()
    with LLM(spliced_engine, backend="onnxruntime", prefix_cache=False) as llm:
        out = llm.generate(prompt_token_ids=[prompt], images=[buffer.getvalue()],
                           params=SamplingParams(temperature=0, max_new_tokens=1, prompt_logprobs=0))[0]
    got = np.array([lp.logprob for lp in out.prompt_logprobs[1:]])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_prompt_logprobs_of_an_image_longer_than_a_scoring_call_are_refused_in_one_line(spliced_engine):
    from engine_builder.runner.core.image_prompt import ImagePrompt

    ids = [COMMON["bos_token_id"], BOI_TOKEN, *[IMAGE_TOKEN] * 20, EOI_TOKEN, 5]
    image = ImagePrompt(ids, np.arange(2, 22), np.zeros((20, COMMON["hidden_size"]), np.float32), ids, whole=True)
    with LLM(spliced_engine, backend="onnxruntime") as llm:
        with pytest.raises(UnsupportedError, match="20 image positions' logits from one engine call.*returns 16"):
            llm.generator.new_request(0, ids, SamplingParams(max_new_tokens=1, prompt_logprobs=0), image)
        llm.generator.new_request(0, ids, SamplingParams(max_new_tokens=1), image)  # without scoring: taken


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_image_prompts_prefilled_in_one_call_answer_as_alone(spliced_engine, backend):
    """Two Gemma 3 image prompts of one width share a prefill call: each image's tokens attend both ways within
    their own row only, and each answer is the one it gets alone (alone: transformers' tokens, tests above)."""
    pngs = []
    for seed in (31, 32):
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 48, 3), np.uint8)).save(buffer, "PNG")
        pngs.append(buffer.getvalue())
    prompts, params = [image_prompt(33), image_prompt(34)], SamplingParams(temperature=0, max_new_tokens=STEPS,
                                                                            ignore_eos=True)
    with LLM(spliced_engine, backend=backend, prefix_cache=False) as llm:
        together = llm.generate(prompt_token_ids=prompts, params=params, images=[[p] for p in pngs])
        assert llm.generator.admission.prefills.batched_requests == 2
        alone = [llm.generate(prompt_token_ids=[p], params=params, images=[[png]])[0] for p, png in zip(prompts, pngs)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert together[0].token_ids != together[1].token_ids
