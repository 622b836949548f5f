"""LLaVA: a tiny random LlavaForConditionalGeneration (CLIP tower, 2 layers; tiny llama text model) made in code,
converted; the vision graph's features against transformers' get_image_features, and the converted + built text
decoder's greedy tokens against transformers' generate on a text-only prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from hf_greedy import assert_greedy_equals_hf
from tiny_llava import IMAGE_TOKEN, tiny_llava
from tiny_models import COMMON

from converters.convert import convert
from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import EngineManifest
from engine_builder.formats.vision_spec import VISION_MODEL
from engine_builder.network.vision_encoder import write_vision_onnx
from engine_builder.util.file_hash import sha256_file

STEPS = 16


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("llava")
    hf_dir = tiny_llava(root / "hf")
    convert(hf_dir, root / "ckpt", dtype="float32")
    return hf_dir, root / "ckpt"


def _hf(hf_dir: Path) -> transformers.LlavaForConditionalGeneration:
    return transformers.LlavaForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("feature_layer, strategy", [(-2, "default"), ([-3, -1], "full")])
def test_vision_features_match_transformers(llava, tmp_path, feature_layer, strategy):
    """The vision graph on onnxruntime vs get_image_features: the default (-2, class token cropped), and two
    hidden states concatenated (the embeddings and the last layer's) with the class token kept."""
    if (feature_layer, strategy) == (-2, "default"):
        hf_dir, ckpt = llava
    else:
        hf_dir = tiny_llava(tmp_path / "hf", feature_layer, strategy)
        ckpt = tmp_path / "ckpt"
        convert(hf_dir, ckpt, dtype="float32")
    path = write_vision_onnx(ckpt, tmp_path / "vision")
    pixels = np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32)  # 3 images
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": pixels})[0]
    with torch.no_grad():
        want = torch.stack(list(_hf(hf_dir).get_image_features(torch.from_numpy(pixels)).pooler_output)).numpy()
    tokens = 16 + (strategy == "full")
    assert got.shape == want.shape == (3, tokens, COMMON["hidden_size"])
    assert np.abs(want).max() > 0.5  # features of a real size, where a wrong layer or layout shows
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.fixture(scope="module")
def engine(llava, tmp_path_factory) -> Path:
    _, ckpt = llava
    out = tmp_path_factory.mktemp("llava-engine") / "engine"
    build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                 limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))
    return out


@pytest.mark.parametrize("text", ["llama", "qwen2", "mistral"])
def test_text_only_greedy_generation_matches_transformers(llava, engine, tmp_path, text):
    """The text decoder of each supported text model, converted by its own converter and built unchanged."""
    if text == "llama":
        hf_dir, ckpt = llava
    else:
        hf_dir, ckpt = tiny_llava(tmp_path / "hf", text=text), tmp_path / "ckpt"
        convert(hf_dir, ckpt, dtype="float32")
        engine = tmp_path / "engine"
        build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                        limits=Limits(max_batch=1, max_input_len=32, max_seq_len=64)))
    assert EngineManifest.load(engine).model.vision == CheckpointConfig.load(ckpt).model.vision
    assert EngineManifest.load(engine).model.block.attention.qkv_bias == (text == "qwen2")
    prompt = np.random.default_rng(7).integers(3, IMAGE_TOKEN, 20).tolist()  # no image token
    hf = _hf(hf_dir)
    assert_greedy_equals_hf(hf, engine, prompt, STEPS)


def test_build_writes_the_vision_graph_beside_the_decoder(llava, engine):
    """vision.onnx in the engine dir, its hash in the manifest, its features transformers'."""
    hf_dir, _ = llava
    path = engine / VISION_MODEL
    assert EngineManifest.load(engine).graph_hashes["vision"] == sha256_file(path)
    pixels = np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)  # one image
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": pixels})[0]
    with torch.no_grad():
        want = torch.stack(list(_hf(hf_dir).get_image_features(torch.from_numpy(pixels)).pooler_output)).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_vision_graph_builds_with_tensorrt_rtx(llava, tmp_path, dtype):
    """A real TensorRT-RTX build (sm80/sm86, no GPU needed) with a profile over 1..4 images per call: every op
    parses to a native layer (one convolution for the patches, a normalization per LayerNorm)."""
    pytest.importorskip("tensorrt_rtx", reason="pip install tensorrt-rtx-cu13")
    from engine_builder.network.options import NetworkOptions
    from engine_builder.trt.engine_build import TrtBuildOptions, build_engine

    _, ckpt = llava
    path = write_vision_onnx(ckpt, tmp_path, NetworkOptions(dtype=dtype))
    shape = (3, 32, 32)
    report = build_engine(path, tmp_path / "vision.engine", TrtBuildOptions(
        compute_capabilities=("sm80", "sm86"), profiles=({"pixel_values": ((1, *shape), (1, *shape), (4, *shape))},),
        decomposable_attention=dtype == "float32"))
    assert report.engine_path.is_file() and report.engine_bytes > 0
    layers = report.network_layer_types
    # feature layer -2 of a 2-layer tower: one layer computed; pre-norm + its two norms
    assert (layers["CONVOLUTION"], layers["NORMALIZATION"], layers["SOFTMAX"]) == (1, 3, 1)
