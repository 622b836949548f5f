"""fuse_rms_norm: every decomposed form becomes one RMSNormalization, outputs unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx.helper import make_node, make_tensor_value_info
from ort_check import model_from_helper, run

import passes  # noqa: F401
from passes.base import get_pass
from passes.graph_stats import op_counts

H = 32
RNG = np.random.default_rng(0)


def _c(name, value, dtype=np.float32):
    return onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def rms_graph(form: str, gemma: bool, fp16: bool):
    """Two chained RMSNorms in the given decomposed form."""
    dt = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    nodes, inits = [], [_c("two", 2.0), _c("eps", 1e-6), _c("one", 1.0), _c("axes", [-1], np.int64)]
    x = "x"
    for i in range(2):
        p = f"n{i}_"
        xc = x
        if fp16:
            nodes.append(make_node("Cast", [x], [p + "xc"], to=TensorProto.FLOAT))
            xc = p + "xc"
        nodes += [make_node("Pow", [xc, "two"], [p + "sq"]),
                  make_node("ReduceMean", [p + "sq", "axes"], [p + "ms"], keepdims=1),
                  make_node("Add", [p + "ms", "eps"], [p + "mse"]), make_node("Sqrt", [p + "mse"], [p + "rms"])]
        if form == "reciprocal":
            nodes += [make_node("Reciprocal", [p + "rms"], [p + "inv"]), make_node("Mul", [xc, p + "inv"], [p + "n"])]
        elif form == "div_one":
            nodes += [make_node("Div", ["one", p + "rms"], [p + "inv"]), make_node("Mul", [xc, p + "inv"], [p + "n"])]
        else:
            nodes.append(make_node("Div", [xc, p + "rms"], [p + "n"]))
        normed = p + "n"
        if fp16:
            nodes.append(make_node("Cast", [normed], [p + "nc"], to=TensorProto.FLOAT16))
            normed = p + "nc"
        w = RNG.standard_normal(H).astype(np.float16 if fp16 else np.float32)
        inits.append(onnx.numpy_helper.from_array(w, p + "w"))
        scale = p + "w"
        if gemma:
            inits.append(_c(p + "one", 1.0, np.float16 if fp16 else np.float32))
            nodes.append(make_node("Add", [p + "w", p + "one"], [p + "w1"]))
            scale = p + "w1"
        x = "y" if i == 1 else p + "out"
        nodes.append(make_node("Mul", [normed, scale] if i == 0 else [scale, normed], [x]))
    return model_from_helper(nodes, [make_tensor_value_info("x", dt, [2, 3, H])],
                             [make_tensor_value_info("y", dt, [2, 3, H])], inits)


@pytest.mark.parametrize("form", ["reciprocal", "div_one", "div"])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("fp16", [False, True])
def test_fuse_rms_norm(form, gemma, fp16):
    model = rms_graph(form, gemma, fp16)
    feeds = {"x": RNG.standard_normal((2, 3, H)).astype(np.float16 if fp16 else np.float32)}
    before, expected = op_counts(model), run(model, feeds)[0]
    assert get_pass("fuse_rms_norm").apply(model) == 2
    after = op_counts(model)
    assert after["RMSNormalization"] == 2
    assert after["ReduceMean"] == after["Pow"] == after["Sqrt"] == 0
    assert after["Add"] == (2 if gemma else 0)  # gemma keeps (1 + w) as an Add on the weight
    assert sum(after.values()) < sum(before.values())
    atol = 2e-3 if fp16 else 1e-5  # fp16: one rounding of the product differs (scale applied in fp16)
    np.testing.assert_allclose(run(model, feeds)[0].astype(np.float32), expected.astype(np.float32),
                               atol=atol, rtol=atol)
    assert get_pass("fuse_rms_norm").apply(model) == 0


def test_wrong_exponent_is_not_fused_and_says_why():
    model = rms_graph("reciprocal", False, False)
    model.graph.initializers["two"].const_value = onnx_ir_tensor(3.0)
    assert get_pass("fuse_rms_norm").apply(model) == 0
    assert "exponent is not 2" in get_pass("fuse_rms_norm").why_not(model)


def onnx_ir_tensor(value: float):
    import onnx_ir as ir

    return ir.tensor(np.asarray(value, np.float32))
