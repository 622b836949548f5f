"""fold_constants, eliminate_dead_code, remove_redundant_ops: op counts change, outputs do not."""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import TensorProto
from onnx.helper import make_node, make_tensor_value_info
from ort_check import assert_same_outputs, model_from_helper, run

import passes  # noqa: F401  (registers every pass)
from passes.base import PassManager, get_pass
from passes.graph_stats import op_counts

X = make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
Y = make_tensor_value_info("y", TensorProto.FLOAT, None)
FEEDS = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}


def _const(name: str, values, dtype=np.int64):
    return onnx.numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def check_pass(name: str, model, removed: dict[str, int]) -> None:
    before_counts, before_out = op_counts(model), run(model, FEEDS)
    matches = get_pass(name).apply(model)
    after_counts = op_counts(model)
    for op, n in removed.items():
        assert before_counts[op] - after_counts[op] == n, (op, before_counts, after_counts)
    assert matches > 0
    assert_same_outputs(before_out, run(model, FEEDS))
    # idempotent: a second run finds nothing and changes nothing
    assert get_pass(name).apply(model) == 0 and op_counts(model) == after_counts


def test_fold_constants_folds_shape_arithmetic():
    model = model_from_helper(
        [make_node("Add", ["a", "b"], ["ab"]), make_node("Mul", ["ab", "b"], ["shape"]),
         make_node("Reshape", ["x", "shape"], ["y"])],
        [X], [Y], [_const("a", [1, 0]), _const("b", [2, 2])])  # ([1,0]+2)*2 = [6, 4]
    check_pass("fold_constants", model, {"Add": 1, "Mul": 1})


def test_fold_constants_leaves_weight_sized_tensors_alone():
    big = onnx.numpy_helper.from_array(np.ones((512, 256), np.float32), "w")
    model = model_from_helper([make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                               make_node("ReduceSum", ["wt"], ["y"], keepdims=0)],
                              [], [Y], [big])
    assert get_pass("fold_constants").apply(model) == 0
    assert op_counts(model)["Transpose"] == 1


def test_eliminate_dead_code():
    model = model_from_helper(
        [make_node("Relu", ["x"], ["y"]), make_node("Exp", ["x"], ["dead1"]), make_node("Neg", ["dead1"], ["dead2"])],
        [X], [Y], [_const("unused", [1, 2, 3])])
    check_pass("eliminate_dead_code", model, {"Exp": 1, "Neg": 1})
    assert "unused" not in model.graph.initializers


def test_remove_redundant_ops():
    model = model_from_helper(
        [make_node("Cast", ["x"], ["i1"], to=TensorProto.FLOAT), make_node("Identity", ["i1"], ["c1"]),
         make_node("Reshape", ["c1", "s1"], ["r1"]), make_node("Reshape", ["r1", "s2"], ["r2"]),
         make_node("Identity", ["r2"], ["i2"]), make_node("Relu", ["i2"], ["y"])],
        [X], [Y], [_const("s1", [6, 4]), _const("s2", [2, 12])])
    check_pass("remove_redundant_ops", model, {"Identity": 2, "Cast": 1, "Reshape": 1})


def test_pass_manager_reports_counts_and_why_not():
    model = model_from_helper([make_node("Relu", ["x"], ["y"])], [X], [Y])
    results = PassManager(["remove_redundant_ops", "eliminate_dead_code"]).run(copy.deepcopy(model), explain=True)
    assert [(r.name, r.matches) for r in results] == [("remove_redundant_ops", 0), ("eliminate_dead_code", 0)]
    assert all(r.why_not for r in results)


def test_unknown_pass_lists_known_ones():
    import pytest

    from engine_builder.util.errors import ConfigError

    with pytest.raises(ConfigError, match="known passes: .*fold_constants"):
        PassManager(["fuse_everything"])
