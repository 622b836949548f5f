"""An int8 linear at float activations in onnxruntime: the 8-bit MatMulNBits, the pair of 4-bit ones that
passes/lower_ort_matmulnbits.py emits instead (d q = 16 d (h - 8) + d l, exact), and the float32 MatMul.

    .venv/bin/python benchmarks/int8_exact_head.py [--k 576] [--n 49152] [--threads 2] [--runs 200]

Default shape: SmolLM2-135M's head (the GGUF's Q8_0 token table, blocks of 32). Prints the median ms per call
and each form's largest error against float64 on the same random codes and fp16-exact scales.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32


def packed(nibbles: np.ndarray) -> np.ndarray:
    """[N, K] values 0..15 -> MatMulNBits' B [N, K / BLOCK, BLOCK / 2], low nibble first."""
    n, k = nibbles.shape
    pairs = nibbles.reshape(n, k // BLOCK, BLOCK // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def zero_points(n: int, blocks: int, z: int) -> np.ndarray:
    return np.full((n, (blocks + 1) // 2), z * 0x11, np.uint8).reshape(-1)


def model(k: int, n: int, nodes: list, inits: list) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def nbits(inputs: list[str], out: str, k: int, n: int, bits: int, level: int):
    return helper.make_node("MatMulNBits", inputs, [out], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=BLOCK, accuracy_level=level)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=576)
    parser.add_argument("--n", type=int, default=49152)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    k, n, blocks = args.k, args.n, args.k // BLOCK
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(n, k)).astype(np.int16)
    d = (rng.random((n, blocks)) * 0.01 + 0.001).astype(np.float16).astype(np.float32)
    w = (q.reshape(n, blocks, BLOCK) * d[..., None]).reshape(n, k).astype(np.float32)
    u = (q + 128).astype(np.uint8)
    scales = numpy_helper.from_array(d.reshape(-1), "s")
    forms = {
        "int8 MatMulNBits, level 0": model(k, n, [nbits(["x", "b", "s"], "y", k, n, 8, 0)],
                                           [numpy_helper.from_array(u.reshape(n, blocks, BLOCK), "b"), scales]),
        "int8 MatMulNBits, level 4 (int8 activations)": model(
            k, n, [nbits(["x", "b", "s"], "y", k, n, 8, 4)],
            [numpy_helper.from_array(u.reshape(n, blocks, BLOCK), "b"), scales]),
        "two 4-bit MatMulNBits, level 0 (the pass)": model(
            k, n, [nbits(["x", "bh", "s16", "z8"], "h", k, n, 4, 0), nbits(["x", "bl", "s", "z0"], "l", k, n, 4, 0),
                   helper.make_node("Add", ["h", "l"], ["y"])],
            [numpy_helper.from_array(packed(u >> 4), "bh"), numpy_helper.from_array(packed(u & 15), "bl"), scales,
             numpy_helper.from_array((d * 16).reshape(-1), "s16"),
             numpy_helper.from_array(zero_points(n, blocks, 8), "z8"),
             numpy_helper.from_array(zero_points(n, blocks, 0), "z0")]),
        "float32 MatMul": model(k, n, [helper.make_node("MatMul", ["x", "wt"], ["y"])],
                                [numpy_helper.from_array(np.ascontiguousarray(w.T), "wt")]),
    }
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    print(f"[1, {k}] x [{k}, {n}], {args.threads} threads, onnxruntime {ort.__version__}; "
          f"|y| up to {np.abs(want).max():.1f}")
    for name, graph in forms.items():
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"x": x})[0]
        runs = args.runs if "level 0" not in name or "two" in name else max(3, args.runs // 50)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            session.run(None, {"x": x})
            times.append(time.perf_counter() - started)
        print(f"{name:48s} {statistics.median(times) * 1e3:8.3f} ms   max error {np.abs(got - want).max():.2e}")


if __name__ == "__main__":
    main()
