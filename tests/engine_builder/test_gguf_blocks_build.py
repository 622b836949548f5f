"""A `convert --quant gguf` checkpoint in the graph: the GGUF's own 4-bit blocks computed exactly.

The reference is Hugging Face transformers loading the same GGUF file (it dequantizes every block
to float32), so a graph that keeps the blocks must give its logits: the unfused graph
(DequantizeLinear -> MatMul plus the offsets' small GEMM) and the default onnxruntime twin alike
(MatMulNBits, which lower_ort_matmulnbits gives float activations, accuracy level 0, where a linear
has block offsets). TensorRT-RTX builds the same graph with each int4 DequantizeLinear
fused into its GEMM.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir
import pytest
from gguf import GGMLQuantizationType as Q
from hf_reference import hf_greedy, prompt_of
from ort_helpers import OrtDecoder
from test_build import SMALL
from test_quantized_numerics import STEPS, max_error
from tiny_gguf import tiny_gguf

from converters.convert import convert
from engine_builder.build.pipeline import build, trt_profiles
from engine_builder.formats.build_config import BuildConfig, Limits
from engine_builder.formats.checkpoint import CheckpointConfig
from engine_builder.formats.manifest import ORT_MODEL, TRT_MODEL
from engine_builder.network import NetworkOptions, write_onnx
from engine_builder.trt.engine_build import TrtBuildOptions, build_engine


@pytest.fixture(scope="module")
def gguf_ckpt(module_tmp_factory):
    """(GGUF file, its --quant gguf checkpoint): Q4_1 everywhere but one Q4_0 and one Q4_K linear."""
    root = module_tmp_factory.mktemp("gguf-build")
    src = tiny_gguf(root / "tiny.gguf", {"blk.1.attn_output.weight": Q.Q4_0, "blk.0.ffn_down.weight": Q.Q4_K})
    convert(src, root / "ckpt", quant="gguf")
    return src, root / "ckpt"


@pytest.fixture(scope="module")
def hf_reference(gguf_ckpt):
    src, _ = gguf_ckpt
    prompt = prompt_of(20, seed=6, vocab=128)
    return prompt, hf_greedy(src.parent, prompt, STEPS, gguf_file=src.name)


def test_unfused_graph_equals_transformers_on_the_gguf(gguf_ckpt, hf_reference, tmp_path):
    _, ckpt = gguf_ckpt
    prompt, (want_tokens, want_logits) = hf_reference
    graph = write_onnx(ckpt, tmp_path / "unfused", NetworkOptions(max_seq_len=64, dtype="float32"))
    tokens, logits = OrtDecoder(graph, level="disable_all").greedy(prompt, STEPS)
    assert max_error(logits, want_logits) <= 1e-4
    assert tokens == want_tokens


def test_ort_twin_equals_transformers_on_the_gguf(gguf_ckpt, hf_reference, tmp_path):
    _, ckpt = gguf_ckpt
    prompt, (want_tokens, want_logits) = hf_reference
    out = tmp_path / "engine"
    result = build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                          limits=Limits(max_batch=2, max_input_len=64, max_seq_len=64)))
    counts = {r["name"]: r["matches"] for r in result.passes["onnxruntime"]}
    assert counts["lower_ort_matmulnbits"] == len(CheckpointConfig.load(ckpt).quantization.quantized)
    assert json.loads((out / "config.json").read_text())["quantization"]["onnxruntime_accuracy_level"] == 0
    tokens, logits = OrtDecoder(out / ORT_MODEL, level="basic").greedy(prompt, STEPS)
    assert max_error(logits, want_logits) <= 1e-4
    assert tokens == want_tokens


def test_tensorrt_fuses_the_int4_blocks_into_their_gemm(gguf_ckpt, tmp_path):
    _, ckpt = gguf_ckpt
    n = len(CheckpointConfig.load(ckpt).quantization.quantized)
    out = tmp_path / "engine"
    result = build(ckpt, out, BuildConfig(targets=("tensorrt",), limits=SMALL, compute_capabilities=("sm86",)))
    assert (out / "rank0.engine").stat().st_size == result.engine_bytes > 0
    layers = result.tensorrt["network_layer_types"]
    assert layers["DEQUANTIZE"] == n
    assert layers["MATRIX_MULTIPLY"] == 2 * n  # each linear's int4 GEMM and its offsets' GEMM

    model = ir.load(out / TRT_MODEL)
    weight_dqs = [node for node in model.graph if node.op_type == "DequantizeLinear"]
    profiles = trt_profiles(BuildConfig(limits=SMALL), list(model.graph.inputs))
    report = build_engine(out / TRT_MODEL, tmp_path / "again.engine",
                          TrtBuildOptions(compute_capabilities=("sm86",), profiles=profiles))
    for dq in weight_dqs:
        matmul = next(use.node for use in dq.outputs[0].uses()).outputs[0].uses()[0].node  # DQ -> Transpose -> MatMul
        layers = report.layers_for(dq.name)
        assert layers and all(matmul.name in layer.onnx_nodes for layer in layers), (dq.name, layers)

    # what TensorRT parsed, run in onnxruntime in float16, against the float32 twin: fp16 rounding only
    prompt = prompt_of(12, seed=5, vocab=128)
    _, logits = OrtDecoder(out / TRT_MODEL).greedy(prompt, 4)
    f32 = tmp_path / "f32"
    build(ckpt, f32, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=SMALL))
    _, want = OrtDecoder(f32 / ORT_MODEL).greedy(prompt, 4)
    for got, ref in zip(logits, want):
        assert np.abs(got - ref).max() <= 0.01 * np.abs(ref).max()
