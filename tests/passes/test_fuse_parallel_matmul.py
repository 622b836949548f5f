"""fuse_qkv and fuse_gate_up on a graph shaped like an exporter's attention/MLP projections."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx.helper import make_node, make_tensor_value_info
from ort_check import assert_same_outputs, model_from_helper, run

import passes  # noqa: F401
from passes.base import get_pass
from passes.graph_stats import op_counts

RNG = np.random.default_rng(0)
H = 16


def _w(name: str, cols: int, rows: int = H) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(RNG.standard_normal((rows, cols)).astype(np.float32), name)


def projections_model():
    """x -> q,k,v (three MatMuls, k/v narrower as in GQA); h -> gate, up (two MatMuls); a bias on q."""
    nodes = [make_node("MatMul", ["x", "wq"], ["q"]), make_node("Add", ["q", "bq"], ["qb"]),
             make_node("MatMul", ["x", "wk"], ["k"]), make_node("MatMul", ["x", "wv"], ["v"]),
             make_node("Concat", ["qb", "k", "v"], ["attn"], axis=-1),
             make_node("MatMul", ["attn", "wo"], ["h"]),
             make_node("MatMul", ["h", "wg"], ["g"]), make_node("MatMul", ["h", "wu"], ["u"]),
             make_node("Sigmoid", ["g"], ["sg"]), make_node("Mul", ["g", "sg"], ["silu"]),
             make_node("Mul", ["silu", "u"], ["y"])]
    inits = [_w("wq", H), _w("wk", H // 2), _w("wv", H // 2), _w("wo", H, rows=2 * H), _w("wg", 24), _w("wu", 24),
             onnx.numpy_helper.from_array(RNG.standard_normal(H).astype(np.float32), "bq")]
    return model_from_helper(nodes, [make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, H])],
                             [make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 24])], inits)


FEEDS = {"x": RNG.standard_normal((2, 5, H)).astype(np.float32)}


def check(name: str, matmuls_removed: int, splits: int, matches: int) -> None:
    model = projections_model()
    before, before_out = op_counts(model), run(model, FEEDS)
    assert get_pass(name).apply(model) == matches
    after = op_counts(model)
    assert before["MatMul"] - after["MatMul"] == matmuls_removed
    assert after["Split"] == splits
    np.testing.assert_allclose(run(model, FEEDS)[0], before_out[0], atol=1e-5, rtol=1e-5)
    assert get_pass(name).apply(model) == 0  # idempotent
    assert_same_outputs(before_out, run(model, FEEDS), atol=1e-5)


def test_fuse_qkv():
    check("fuse_qkv", matmuls_removed=2, splits=1, matches=1)


def test_fuse_gate_up():
    check("fuse_gate_up", matmuls_removed=1, splits=1, matches=1)


def test_why_not_explains():
    model = projections_model()
    get_pass("fuse_qkv").apply(model)
    assert "exactly 3 MatMuls" in get_pass("fuse_qkv").why_not(model)
