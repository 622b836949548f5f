"""lower_ort_norms on every tiny architecture, and the whole onnxruntime lowering pipeline after it."""

from __future__ import annotations

import pytest
from ort_lowering_check import assert_matches_unfused, fused_decoder, save_beside

from passes.base import PassManager, get_pass
from passes.graph_stats import op_counts

SKIP_NORM = "com.microsoft.SkipSimplifiedLayerNormalization"
ORT_LOWERING = ["lower_ort_norms", "lower_ort_attention"]


@pytest.fixture
def fused(arch, tiny_model_dir, tmp_path):
    return fused_decoder(tiny_model_dir(arch), tmp_path)


def test_residual_add_and_norm_become_one_op(fused):
    cfg, path, model = fused
    before = op_counts(model)
    # every norm reading a residual sum: all attn/mlp norms but layer 0's attn_norm (it reads the
    # embedding) and the final norm (behind the last-position Gather); gemma's post-norms read a
    # branch output, not a sum
    expected = 2 * cfg.num_layers - 1
    assert get_pass("lower_ort_norms").apply(model) == expected
    after = op_counts(model)
    assert after[SKIP_NORM] == expected
    assert before["RMSNormalization"] - after["RMSNormalization"] == expected
    assert before["Add"] - after["Add"] == expected  # the sum is the fused op's 4th output
    lowered = save_beside(model, path, "norms")
    for level in ("disable_all", "basic"):
        assert_matches_unfused(path, lowered, level)
    assert get_pass("lower_ort_norms").apply(model) == 0  # idempotent
    assert get_pass("lower_ort_norms").why_not(model)


@pytest.mark.parametrize("level", ["basic", "all"])
def test_ort_lowering_pipeline(fused, level):
    """Both lowerings as the onnxruntime target runs them, at both optimization levels we might ship."""
    cfg, path, model = fused
    results = {r.name: r.matches for r in PassManager(ORT_LOWERING).run(model)}
    assert results == {"lower_ort_norms": 2 * cfg.num_layers - 1, "lower_ort_attention": cfg.num_layers}
    assert_matches_unfused(path, save_beside(model, path, "ort"), level)


def test_16_bit_residuals_are_left_alone(tiny_model_dir, tmp_path):
    _, _, model = fused_decoder(tiny_model_dir("llama"), tmp_path, dtype="float16")
    assert op_counts(model)["RMSNormalization"] > 0
    assert get_pass("lower_ort_norms").apply(model) == 0
    assert "float32" in get_pass("lower_ort_norms").why_not(model)


def test_onnxruntime_folds_weight_transposes_at_basic(tiny_model_dir, tmp_path):
    """The emitter keeps weights [out, in] behind a Transpose node; without lower_ort_matmul_transb (the
    16-bit twins) the ORT target relies on onnxruntime's constant folding (level BASIC and up) to turn
    them into initializers at session creation. Left unfolded (ORT_DISABLE_ALL) they would run on
    every step."""
    import onnx
    import onnxruntime as ort

    cfg, path, model = fused_decoder(tiny_model_dir("llama"), tmp_path)
    PassManager(ORT_LOWERING).run(model)
    lowered = save_beside(model, path, "ort")
    assert sum(n.op_type == "Transpose" for n in model.graph) == 4 * cfg.num_layers + 1  # qkv, o, gate_up, down; head
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(lowered), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert [n.op_type for n in optimized.graph.node if n.op_type == "Transpose"] == []
    initializers = {i.name for i in optimized.graph.initializer}
    matmuls = [n for n in optimized.graph.node if n.op_type == "MatMul"]
    assert len(matmuls) == 4 * cfg.num_layers + 1 and all(n.input[1] in initializers for n in matmuls)
