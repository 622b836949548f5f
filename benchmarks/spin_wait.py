"""onnxruntime's intra-op spin-waiting on a SmolLM2-shaped int4 decode step, quiet and with competing load.

    python benchmarks/spin_wait.py [--threads 2] [--steps 200] [--rounds 5] [--busy 0 2]

A synthetic graph of SmolLM2-135M's decode shape (30 layers of qkv 576->960, o 576->576,
gate_up 576->3072, down 1536->576 as int4 MatMulNBits, block 32, accuracy level 4, with the
norms, SiLU and residual adds; an int8 576->49152 lm_head), random weights, one token per run.
Sessions with session.intra_op.allow_spinning 1 (onnxruntime's default) and 0 run round-robin;
--busy N starts N single-threaded busy-loop processes beside them (other work on a shared
machine), each setting run --rounds times. Pin the whole run to --threads cores with `taskset`
to model a machine with that many cores. Prints ms per step (median) per (spin, busy).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time

import numpy as np


def graph(seed: int = 0) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def nbits(x: str, k: int, n: int, name: str, bits: int = 4) -> str:
        inits.append(numpy_helper.from_array(rng.integers(0, 256, (n, k // 32, 32 * bits // 8), dtype=np.uint8),
                                             f"{name}.B"))
        inits.append(numpy_helper.from_array(rng.uniform(0.001, 0.002, (n, k // 32)).astype(np.float32),
                                             f"{name}.s"))
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.B", f"{name}.s"], [name], domain="com.microsoft",
                                      K=k, N=n, bits=bits, block_size=32, accuracy_level=4))
        return name

    inits.append(numpy_helper.from_array(np.ones(576, np.float32), "gamma"))
    x = "x"
    for i in range(30):
        p = f"l{i}"
        nodes.append(helper.make_node("RMSNormalization", [x, "gamma"], [f"{p}.n1"], axis=-1))
        qkv = nbits(f"{p}.n1", 576, 960, f"{p}.qkv")
        nodes.append(helper.make_node("Slice", [qkv, "zero", "h", "last"], [f"{p}.attn"]))  # attention aside
        o = nbits(f"{p}.attn", 576, 576, f"{p}.o")
        nodes.append(helper.make_node("Add", [x, o], [f"{p}.r1"]))
        nodes.append(helper.make_node("RMSNormalization", [f"{p}.r1", "gamma"], [f"{p}.n2"], axis=-1))
        gu = nbits(f"{p}.n2", 576, 3072, f"{p}.gu")
        nodes.append(helper.make_node("Split", [gu], [f"{p}.g", f"{p}.u"], axis=-1, num_outputs=2))
        nodes.append(helper.make_node("Sigmoid", [f"{p}.g"], [f"{p}.sg"]))
        nodes.append(helper.make_node("Mul", [f"{p}.g", f"{p}.sg"], [f"{p}.silu"]))
        nodes.append(helper.make_node("Mul", [f"{p}.silu", f"{p}.u"], [f"{p}.h"]))
        d = nbits(f"{p}.h", 1536, 576, f"{p}.down")
        nodes.append(helper.make_node("Add", [f"{p}.r1", d], [f"{p}.out"]))
        x = f"{p}.out"
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
    inits.append(numpy_helper.from_array(np.array([576], np.int64), "h"))
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "last"))
    nbits(x, 576, 49152, "logits", bits=8)
    g = helper.make_graph(nodes, "decode", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 576])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 49152])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def busy_loop(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def main() -> None:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    model = graph()
    sessions = {}
    for spin in ("1", "0"):
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        sessions[spin] = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(1).standard_normal((1, 576)).astype(np.float32)}
    results = {}
    for busy in args.busy:
        stop = multiprocessing.Event()
        others = [multiprocessing.Process(target=busy_loop, args=(stop,)) for _ in range(busy)]
        for p in others:
            p.start()
        times: dict[str, list[float]] = {s: [] for s in sessions}
        for _ in range(args.rounds):
            for spin, s in sessions.items():
                for _ in range(5):
                    s.run(None, x)
                started = time.perf_counter()
                for _ in range(args.steps):
                    s.run(None, x)
                times[spin].append((time.perf_counter() - started) / args.steps * 1000)
        stop.set()
        for p in others:
            p.join()
        for spin, t in times.items():
            results[f"spin={spin} busy={busy}"] = statistics.median(t)
    print(json.dumps({"threads": args.threads, "ms_per_step": results}))


if __name__ == "__main__":
    main()
