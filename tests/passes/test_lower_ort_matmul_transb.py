"""lower_ort_matmul_transb: the float32 twin's weights are read untransposed (no transposed copy at load)."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from ort_lowering_check import assert_matches_unfused, fused_decoder, save_beside, top_level_counts

from engine_builder.formats.build_config import DEFAULT_PASSES
from passes.base import PassManager, get_pass

FUSED_MATMUL = "com.microsoft.FusedMatMul"
ARCHS = ["llama", "llama_tied", "qwen2", "gpt2"]  # untied / tied lm_head, qkv biases, GPT-2's re-laid-out Conv1D


@pytest.mark.parametrize("arch", ARCHS)
def test_every_linear_reads_its_weight_untransposed(arch, tiny_model_dir, tmp_path):
    cfg, path, model = fused_decoder(tiny_model_dir(arch), tmp_path)
    before = top_level_counts(model)
    linears = 4 * cfg.num_layers + 1  # qkv, o, gate_up (or fc), down; lm_head
    assert get_pass("lower_ort_matmul_transb").apply(model) == linears
    after = top_level_counts(model)
    assert after[FUSED_MATMUL] == linears
    assert before["MatMul"] - after["MatMul"] == linears
    assert before["Transpose"] - after["Transpose"] == linears  # the attention's own Transposes stay
    lowered = save_beside(model, path, "transb")
    for level in ("disable_all", "all"):
        assert_matches_unfused(path, lowered, level)
    assert get_pass("lower_ort_matmul_transb").apply(model) == 0  # idempotent
    assert "no node" in get_pass("lower_ort_matmul_transb").why_not(model)


def test_16_bit_twins_keep_the_portable_form(tiny_model_dir, tmp_path):
    _, _, model = fused_decoder(tiny_model_dir("llama"), tmp_path, dtype="float16")
    assert get_pass("lower_ort_matmul_transb").apply(model) == 0
    assert "float32" in get_pass("lower_ort_matmul_transb").why_not(model)


def test_onnxruntime_keeps_no_transposed_weight_copy(tiny_model_dir, tmp_path):
    """After the onnxruntime target's passes, the graph onnxruntime optimizes at level ALL holds no
    Transpose of a weight: every linear is a FusedMatMul reading the [out, in] initializer itself, which
    its prepack lays out for the GEMM directly (before this pass, a Transpose folded at session creation
    made a transposed copy of every weight: most of SmolLM2's cold start, issue 16)."""
    cfg, path, model = fused_decoder(tiny_model_dir("llama"), tmp_path)
    PassManager(DEFAULT_PASSES["onnxruntime"]).run(model)
    lowered = save_beside(model, path, "ort")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(lowered), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    initializers = {i.name: i for i in optimized.graph.initializer}
    linears = [n for n in optimized.graph.node if n.op_type == "FusedMatMul"]
    assert len(linears) == 4 * cfg.num_layers + 1
    assert all(node.input[1].endswith(".weight") and node.input[1] in initializers for node in linears)
    assert not [n for n in optimized.graph.node if n.op_type == "Transpose" and n.input[0] in initializers]
