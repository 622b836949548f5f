"""Quantized linears in float32, on tiny models: the graph computes exactly what FORMAT.md says.

1. The unfused quantized graph (DequantizeLinear -> Transpose -> MatMul) equals the float graph
   built from the dequantized weights: the same decoder, so any difference is the emitter's.
2. The onnxruntime twin after its passes (MatMulNBits at accuracy level 0) equals the unfused
   quantized graph, activation-quantized w8a8 included.
Prefill plus 16 greedy decode steps over the KV cache, logits compared at every step.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_reference import prompt_of
from ort_helpers import OrtDecoder
from quantized_ckpt import dequantized_checkpoint, quantize_checkpoint

from engine_builder.build.pipeline import build
from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import ORT_MODEL
from engine_builder.network import NetworkOptions, write_onnx

STEPS = 17
# tied embeddings (quantized lm_head stored beside embed), biases on qkv, gemma's soft-capping and norms
ARCHS = ["llama", "llama_tied", "qwen2", "gemma2"]
# group 16 divides every tiny input size (64, 96, 128) an even number of times, as zero points need
WEIGHT_ONLY = [("int8_wo", None), ("int4_wo", 32), ("awq", 16)]
EXACT_ORT_PASSES = tuple(p.replace("lower_ort_matmulnbits", "lower_ort_matmulnbits_exact")
                         for p in DEFAULT_PASSES["onnxruntime"])


@pytest.fixture(scope="module")
def quantized(checkpoint_dir, module_tmp_factory):
    """quantized(arch, scheme, group) -> quantized checkpoint dir of that tiny model, made once."""
    made = {}

    def get(arch: str, scheme: str, group: int | None):
        if (arch, scheme, group) not in made:
            out = module_tmp_factory.mktemp(f"{arch}-{scheme}") / "ckpt"
            made[arch, scheme, group] = quantize_checkpoint(checkpoint_dir(arch), out, scheme, group)
        return made[arch, scheme, group]

    return get


def greedy(model_path, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    return OrtDecoder(model_path, level="disable_all").greedy(prompt, STEPS)


def max_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g - w).max()) for g, w in zip(got, want))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("scheme", "group"), WEIGHT_ONLY)
def test_quantized_graph_equals_dequantized_float_graph(quantized, tmp_path, arch, scheme, group):
    qckpt = quantized(arch, scheme, group)
    twin = dequantized_checkpoint(qckpt, tmp_path / "dequantized")
    options = NetworkOptions(max_seq_len=64, dtype="float32")
    prompt = prompt_of(20, seed=3)
    tokens, logits = greedy(write_onnx(qckpt, tmp_path / "q", options), prompt)
    want_tokens, want_logits = greedy(write_onnx(twin, tmp_path / "f", options), prompt)
    # the same float32 ops on the same weights: only DequantizeLinear's own rounding remains
    assert max_error(logits, want_logits) <= 1e-5
    assert tokens == want_tokens


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("scheme", "group"), [*WEIGHT_ONLY, ("w8a8_sq", None)])
def test_ort_twin_equals_unfused_quantized_graph(quantized, tmp_path, arch, scheme, group):
    qckpt = quantized(arch, scheme, group)
    out = tmp_path / "engine"
    limits = Limits(max_batch=2, max_input_len=64, max_seq_len=64)
    build(qckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                  passes=PassLists(onnxruntime=EXACT_ORT_PASSES)))
    manifest = json.loads((out / "config.json").read_text())
    counts = {r["name"]: r["matches"] for r in manifest["passes"]["onnxruntime"]}
    assert counts["lower_ort_matmulnbits_exact"] == len(CheckpointConfig.load(qckpt).quantization.quantized)
    assert manifest["quantization"] == {"scheme": scheme, "kv_cache": "none", "onnxruntime_accuracy_level": 0}
    prompt = prompt_of(20, seed=4)
    tokens, logits = OrtDecoder(out / ORT_MODEL, level="basic").greedy(prompt, STEPS)
    want_tokens, want_logits = greedy(write_onnx(qckpt, tmp_path / "unfused", NetworkOptions(max_seq_len=64)),
                                      prompt)
    assert max_error(logits, want_logits) <= 1e-4
    assert tokens == want_tokens
