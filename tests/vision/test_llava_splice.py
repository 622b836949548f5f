"""LLaVA's decoder with image features spliced in (issue 35): the built model.onnx, run directly in an onnxruntime
session (its inputs fed as runner/ort_backend.py binds them, plus image_embeds / image_mask), against transformers'
LlavaForConditionalGeneration on the same pixels and prompt: last-position logits and greedy tokens. Also: a text
model's graph gains no input, both KV layouts build the vision decoder, and vision.onnx is a verified file."""

from __future__ import annotations

import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers
from cli_process import assert_user_error, trtbuild
from runner_engines import build_engine, build_paged_engine
from safetensors.torch import load_file
from tiny_gemma3 import BOI_TOKEN, EOI_TOKEN, TOKENS_PER_IMAGE, tiny_gemma3
from tiny_gemma3 import IMAGE_SIZE as GEMMA3_SIZE
from tiny_gemma3 import IMAGE_TOKEN as GEMMA3_IMAGE
from tiny_llava import IMAGE_TOKEN, tiny_llava
from tiny_models import COMMON

from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats import graph_io as io
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import ORT_MODEL, EngineManifest
from engine_builder.formats.vision_spec import VISION_MODEL
from engine_builder.network import NetworkOptions, build_decoder
from engine_builder.runner.engine_integrity import verify_engine_dir

LIMITS = Limits(max_batch=2, max_input_len=48, max_seq_len=64)
TOKENS = 16  # tokens_per_image of the tiny tower: (32 / 8) ** 2 patches, the class token cropped
STEPS = 8
HIDDEN = COMMON["hidden_size"]


@pytest.fixture(scope="module")
def llava(module_tmp_factory) -> tuple[Path, Path, Path]:
    """(HF dir, checkpoint dir, engine dir built with the default onnxruntime pass list, float32)."""
    root = module_tmp_factory.mktemp("llava-splice")
    hf_dir = tiny_llava(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    return hf_dir, root / "ckpt", build_engine(root / "ckpt", root / "engine", LIMITS)


@pytest.fixture(scope="module")
def hf(llava) -> transformers.LlavaForConditionalGeneration:
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        llava[0], dtype=torch.float32, attn_implementation="eager").eval()
    model.generation_config.eos_token_id = None  # random weights may emit EOS; compare every step
    return model


def image_prompt(seed: int) -> list[int]:
    """[bos, text..., image_token_id * TOKENS, text...]: 1 + 5 + 16 + 7 = 29 tokens, none of them the image token
    outside the image."""
    text = np.random.default_rng(seed).integers(3, IMAGE_TOKEN, 12).tolist()
    return [COMMON["bos_token_id"], *text[:5], *[IMAGE_TOKEN] * TOKENS, *text[5:]]


def pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)  # one image


def spliced(prompts: list[list[int]], features: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """image_embeds [rows, seq, hidden] (each image's features at its row's image-token positions, in order; zeros
    elsewhere) and image_mask [rows, seq] (all false for a text row), as the runtime makes them."""
    ids = np.array(prompts)
    mask = ids == IMAGE_TOKEN
    embeds = np.zeros((*ids.shape, HIDDEN), np.float32)
    for row, f in enumerate(features):
        if f is None:
            mask[row] = False
        else:
            embeds[row, mask[row]] = f.reshape(-1, HIDDEN)
    return embeds, mask


class SlotSession:
    """model.onnx in a plain InferenceSession, fed as runner/ort_backend.py binds it: rows starting at 0, positions
    past_lengths + t, zero-filled [rows, kv_heads, max_seq, head_dim] caches, the whole updated cache back."""

    def __init__(self, engine: Path, rows: int):
        self.session = ort.InferenceSession(str(engine / ORT_MODEL), providers=["CPUExecutionProvider"])
        manifest = EngineManifest.load(engine)
        cfg, dtype = manifest.model, getattr(ml_dtypes, manifest.twin_dtype, None) or np.dtype(manifest.twin_dtype)
        self.layers = cfg.num_layers
        shape = (rows, cfg.num_kv_heads, manifest.build.limits.max_seq_len, cfg.head_dim)
        self.cache = {name(i): np.zeros(shape, dtype) for i in range(self.layers)
                      for name in (io.past_key, io.past_value)}
        self.lengths = np.zeros(rows, np.int64)

    def step(self, ids: np.ndarray, embeds: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One call over ids [rows, seq]; the last position's logits [rows, vocab]."""
        seq = ids.shape[1]
        positions = self.lengths[:, None] + np.arange(seq)[None, :]
        outputs = self.session.run(None, {io.INPUT_IDS: ids, io.POSITION_IDS: positions,
                                          io.PAST_LENGTHS: self.lengths.copy(), **self.cache,
                                          io.IMAGE_EMBEDS: embeds, io.IMAGE_MASK: mask})
        names = [o.name for o in self.session.get_outputs()]
        for i in range(self.layers):
            self.cache[io.past_key(i)] = outputs[names.index(io.present_key(i))]
            self.cache[io.past_value(i)] = outputs[names.index(io.present_value(i))]
        self.lengths += seq
        return outputs[names.index(io.LOGITS)][:, -1]


def flip_byte(path: Path) -> None:
    """Edit PATH's last byte in place (same inode and size), as tests/runner/test_engine_integrity.py does."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte ^ 0xFF]))


def hf_features(hf, pixel_values: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.stack(list(hf.get_image_features(torch.from_numpy(pixel_values)).pooler_output)).numpy()


def test_the_decoder_takes_image_embeds_and_mask_only_with_vision(llava, tiny_model_dir, tmp_path):
    """A vision model's graph gains the two inputs (float32 features, a bool mask); a text model's graph is what it
    was: no new input and no node of the splice."""
    _, ckpt, engine = llava
    inputs = {i.name: i for i in onnx.load(str(engine / ORT_MODEL), load_external_data=False).graph.input}
    embeds, mask = inputs[io.IMAGE_EMBEDS].type.tensor_type, inputs[io.IMAGE_MASK].type.tensor_type
    assert embeds.elem_type == onnx.TensorProto.FLOAT and mask.elem_type == onnx.TensorProto.BOOL
    assert [d.dim_param or d.dim_value for d in embeds.shape.dim] == [io.BATCH, io.SEQ, HIDDEN]
    assert [d.dim_param or d.dim_value for d in mask.shape.dim] == [io.BATCH, io.SEQ]

    text_ckpt = tmp_path / "llama-ckpt"
    convert(tiny_model_dir("llama"), text_ckpt, dtype="float32")
    assert CheckpointConfig.load(text_ckpt).model.vision is None
    model = build_decoder(text_ckpt, NetworkOptions(max_seq_len=64))
    names = [v.name for v in model.graph.inputs]
    assert names == [io.INPUT_IDS, io.POSITION_IDS, io.PAST_LENGTHS,
                     *(f(i) for i in range(2) for f in (io.past_key, io.past_value))]
    assert not any("splice_images" in (n.name or "") for n in model.graph)


def test_prefill_logits_with_an_image_equal_transformers(llava, hf):
    """Two rows in one call: an image prompt (HF's features spliced at its image tokens) and a text-only prompt of
    the same length (all-false mask); each row's last-position logits against LlavaForConditionalGeneration's."""
    _, _, engine = llava
    image, text = image_prompt(1), np.random.default_rng(2).integers(3, IMAGE_TOKEN, 29).tolist()
    pixel_values = pixels(3)
    features = hf_features(hf, pixel_values)
    assert features.shape == (1, TOKENS, HIDDEN)
    embeds, mask = spliced([image, text], [features, None])
    got = SlotSession(engine, rows=2).step(np.array([image, text]), embeds, mask)
    with torch.no_grad():
        want_image = hf(input_ids=torch.tensor([image]), pixel_values=torch.from_numpy(pixel_values)).logits[0, -1]
        want_text = hf(input_ids=torch.tensor([text])).logits[0, -1]
        blind = hf(input_ids=torch.tensor([image]).clamp(max=IMAGE_TOKEN - 1)).logits[0, -1]
    # the image changes the answer: a splice that dropped the features would not pass
    assert float((want_image - blind).abs().max()) > 0.5
    np.testing.assert_allclose(got[0], want_image.numpy(), rtol=0, atol=2e-5)
    np.testing.assert_allclose(got[1], want_text.numpy(), rtol=0, atol=2e-5)


def test_greedy_tokens_with_an_image_equal_transformers_generate(llava, hf):
    """vision.onnx's features spliced into the prefill, then decode steps (seq 1, an all-false mask): the greedy
    tokens of transformers' generate on the same pixels."""
    _, _, engine = llava
    prompt, pixel_values = image_prompt(4), pixels(5)
    vision = ort.InferenceSession(str(engine / VISION_MODEL), providers=["CPUExecutionProvider"])
    features = vision.run(None, {"pixel_values": pixel_values})[0]
    np.testing.assert_allclose(features, hf_features(hf, pixel_values), rtol=0, atol=2e-5)
    session = SlotSession(engine, rows=1)
    logits = session.step(np.array([prompt]), *spliced([prompt], [features]))
    got = []
    for _ in range(STEPS):
        got.append(int(logits[0].argmax()))
        logits = session.step(np.array([[got[-1]]]), np.zeros((1, 1, HIDDEN), np.float32), np.zeros((1, 1), bool))
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values), do_sample=False,
                           max_new_tokens=STEPS, pad_token_id=0)[0, len(prompt):].tolist()
    assert got == want
    assert len(set(want)) > STEPS // 2  # a varied continuation, not one token repeated


def test_a_float16_twin_casts_the_features_to_its_dtype(llava, tmp_path):
    """float32 features cast to the twin's dtype before the select: features that are other tokens' embeddings (exact
    in float16) at the masked positions give, bit for bit, the logits of the prompt holding those tokens there. (No
    bfloat16 twin: onnxruntime's CPU Where, which every decoder's causal mask uses, has no bfloat16 kernel.)"""
    _, ckpt, _ = llava
    engine = build_engine(ckpt, tmp_path / "engine", Limits(max_batch=1, max_input_len=48, max_seq_len=64), "float16")
    table = load_file(ckpt / "rank0.safetensors")["embed.weight"].half().float().numpy()  # as the twin holds it
    rng = np.random.default_rng(8)
    prompt, other = rng.integers(3, IMAGE_TOKEN, (2, 1, 29))
    mask = np.zeros((1, 29), bool)
    mask[0, 6:22] = True  # where an image would sit
    swapped = np.where(mask, other, prompt)
    assert (swapped != prompt).any()
    image = SlotSession(engine, rows=1).step(prompt, table[other], mask)
    text = SlotSession(engine, rows=1).step(swapped, np.zeros((1, 29, HIDDEN), np.float32), np.zeros((1, 29), bool))
    assert np.isfinite(text).all() and np.array_equal(image, text)


def test_the_paged_layout_builds_the_vision_decoder_and_splices_the_same(llava, hf, tmp_path):
    """`build --kv-layout paged`: the same two inputs, and the image prompt's prefill logits transformers'."""
    _, ckpt, _ = llava
    engine = build_paged_engine(ckpt, tmp_path / "paged", LIMITS, block=16)
    session = ort.InferenceSession(str(engine / ORT_MODEL), providers=["CPUExecutionProvider"])
    assert {io.IMAGE_EMBEDS, io.IMAGE_MASK, io.BLOCK_TABLE} <= {i.name for i in session.get_inputs()}
    cfg = EngineManifest.load(engine).model
    prompt, pixel_values = image_prompt(6), pixels(7)
    features = hf_features(hf, pixel_values)
    blocks = -(-len(prompt) // 16)
    pool = np.zeros((cfg.num_kv_heads, blocks + 1, 16, cfg.head_dim), np.float32)  # block 0: the scratch block
    outputs = session.run([io.LOGITS], {
        io.INPUT_IDS: np.array([prompt]), io.POSITION_IDS: np.arange(len(prompt))[None],
        io.PAST_LENGTHS: np.zeros(1, np.int64), io.BLOCK_TABLE: np.arange(1, blocks + 1)[None],
        **{name(i): pool.copy() for i in range(cfg.num_layers) for name in (io.kv_pool_key, io.kv_pool_value)},
        **dict(zip((io.IMAGE_EMBEDS, io.IMAGE_MASK), spliced([prompt], [features]), strict=True))})
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values)).logits[0, -1]
    np.testing.assert_allclose(outputs[0][0, -1], want.numpy(), rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_vision_decoder_builds_with_tensorrt_rtx(llava, tmp_path, dtype):
    """A real TensorRT-RTX build (sm80/sm86, no GPU needed): image_embeds [batch, seq, hidden] and
    image_mask [batch, seq] in every profile, the splice a native select layer; the attention fusions match as
    they do for the text model (the splice sits before the first layer)."""
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    _, ckpt, _ = llava
    result = build(ckpt, tmp_path / "engine", BuildConfig(targets=("onnxruntime", "tensorrt"), dtype=dtype,
                                                          twin_dtype="float32", compute_capabilities=("sm80", "sm86"),
                                                          limits=LIMITS))
    profiles = result.tensorrt["profiles"]
    assert [p[io.IMAGE_EMBEDS] for p in profiles] == [[[*s, HIDDEN] for s in p[io.INPUT_IDS]] for p in profiles]
    assert [p[io.IMAGE_MASK] for p in profiles] == [p[io.INPUT_IDS] for p in profiles]
    assert result.tensorrt["network_layer_types"]["SELECT"] >= 1
    for target in ("onnxruntime", "tensorrt"):
        matches = {r["name"]: r["matches"] for r in result.passes[target]}
        assert matches["fuse_attention"] == matches["fuse_kv_cache_update"] / 2 == 2
    assert {r["name"]: r["matches"] for r in result.passes["onnxruntime"]}["lower_ort_attention"] == 2


def test_vision_onnx_is_a_verified_file_and_a_changed_byte_is_refused(llava, tmp_path):
    """The manifest's files record vision.onnx; `trtbuild verify` refuses a changed byte in it (exit 2)."""
    _, ckpt, _ = llava
    engine = build_engine(ckpt, tmp_path / "engine", LIMITS)
    recorded = {d.name: d for d in EngineManifest.load(engine).files}
    assert VISION_MODEL in recorded and recorded[VISION_MODEL].size == (engine / VISION_MODEL).stat().st_size
    assert all(v.ok for v in verify_engine_dir(engine))
    assert trtbuild("verify", engine).returncode == 0
    flip_byte(engine / VISION_MODEL)
    proc = trtbuild("verify", engine)
    assert_user_error(proc, "1 of", VISION_MODEL, f"trtbuild build <ckpt-dir> {engine} --force")
    assert {v.name: v.status for v in verify_engine_dir(engine)}[VISION_MODEL] == "modified"


@pytest.fixture(scope="module")
def gemma3(module_tmp_factory) -> tuple[Path, Path, Path]:
    """A tiny Gemma3ForConditionalGeneration (image_attention "bidirectional"): HF dir, checkpoint, engine."""
    root = module_tmp_factory.mktemp("gemma3-splice")
    hf_dir = tiny_gemma3(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    return hf_dir, root / "ckpt", build_engine(root / "ckpt", root / "engine", LIMITS)


def gemma3_prompt(seed: int, images: int = 2) -> list[int]:
    """[bos, text, (boi, image tokens, eoi, text) per image], as Gemma3Processor lays images out."""
    text = np.random.default_rng(seed).integers(3, BOI_TOKEN, 4 * (images + 1)).tolist()
    prompt = [COMMON["bos_token_id"], *text[:4]]
    for i in range(images):
        prompt += [BOI_TOKEN, *[GEMMA3_IMAGE] * TOKENS_PER_IMAGE, EOI_TOKEN, *text[4 * (i + 1):4 * (i + 2)]]
    return prompt


@pytest.mark.parametrize("layout", ["slots", "paged"])
def test_gemma3_images_attend_both_ways_as_transformers_with_token_type_ids(gemma3, tmp_path, layout):
    """Gemma 3's image tokens see their whole image at prefill (transformers' token_type_ids block mask: OR(causal,
    same image), inside the window on sliding layers), the two images not each other: two images in one prompt, the
    last-position logits and greedy tokens of generate given the token_type_ids Gemma3Processor makes."""
    hf_dir, ckpt, engine = gemma3
    if layout == "paged":
        engine = build_paged_engine(ckpt, tmp_path / "paged", LIMITS, block=16)
    # GroupQueryAttention is causal only: the slot layout's lowering must leave these blocks alone (the paged
    # lowering only reorders the pool writes and keeps the mask)
    assert {r["name"]: r["matches"] for r in EngineManifest.load(engine).passes["onnxruntime"]}[
        "lower_ort_attention"] == 0
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float32,
                                                                     attn_implementation="eager").eval()
    hf.generation_config.eos_token_id = None
    prompt = gemma3_prompt(9)
    pixel_values = np.random.default_rng(10).standard_normal((2, 3, GEMMA3_SIZE, GEMMA3_SIZE)).astype(np.float32)
    vision = ort.InferenceSession(str(engine / VISION_MODEL), providers=["CPUExecutionProvider"])
    features = vision.run(None, {"pixel_values": pixel_values})[0]  # [2, tokens, hidden]
    ids = np.array([prompt])
    mask = ids == GEMMA3_IMAGE
    embeds = np.zeros((1, len(prompt), HIDDEN), np.float32)
    embeds[mask] = features.reshape(-1, HIDDEN)
    hf_inputs = dict(input_ids=torch.tensor([prompt]), pixel_values=torch.from_numpy(pixel_values),
                     token_type_ids=torch.from_numpy(mask.astype(np.int64)))
    with torch.no_grad():
        want = hf(**hf_inputs).logits[0, -1].numpy()
        causal = hf(**{**hf_inputs, "token_type_ids": None}).logits[0, -1].numpy()
        want_tokens = hf.generate(**hf_inputs, do_sample=False, max_new_tokens=STEPS,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    assert np.abs(want - causal).max() > 0.02  # the block mask changes the answer
    if layout == "paged":
        session = ort.InferenceSession(str(engine / ORT_MODEL), providers=["CPUExecutionProvider"])
        cfg = EngineManifest.load(engine).model
        blocks = -(-len(prompt) // 16)
        pool = np.zeros((cfg.num_kv_heads, blocks + 1, 16, cfg.head_dim), np.float32)
        got = session.run([io.LOGITS], {
            io.INPUT_IDS: ids, io.POSITION_IDS: np.arange(len(prompt))[None], io.PAST_LENGTHS: np.zeros(1, np.int64),
            io.BLOCK_TABLE: np.arange(1, blocks + 1)[None], io.IMAGE_EMBEDS: embeds, io.IMAGE_MASK: mask,
            **{name(i): pool.copy() for i in range(cfg.num_layers) for name in (io.kv_pool_key, io.kv_pool_value)}})
        np.testing.assert_allclose(got[0][0, -1], want, rtol=0, atol=2e-5)
        return
    session = SlotSession(engine, rows=1)
    logits = session.step(ids, embeds, mask)
    np.testing.assert_allclose(logits[0], want, rtol=0, atol=2e-5)
    tokens = []
    for _ in range(STEPS):
        tokens.append(int(logits[0].argmax()))
        logits = session.step(np.array([[tokens[-1]]]), np.zeros((1, 1, HIDDEN), np.float32), np.zeros((1, 1), bool))
    assert tokens == want_tokens
