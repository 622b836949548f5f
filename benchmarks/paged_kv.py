"""Decode step time of the paged KV layout vs the slot layout, and what the paged read (gather) costs.

    .venv/bin/python benchmarks/paged_kv.py [--context 256] [--steps 32] [--runs 5] [--batch 1 8]
                                            [--block-size 16] [--threads N] [--work build/bench-paged] [--json]

SmolLM2-135M-Instruct (the bundled GGUF) in float32, two onnxruntime twins built with the default pass
list: `--kv-layout slots` (GroupQueryAttention updating the slot cache in place) and `--kv-layout paged`
(ScatterND into the head-major block pool bound over itself, Gather of the step's blocks, Attention over
them with each KV head's query heads stacked: no transpose of the gathered cache).
Each batch row is prefilled with --context tokens, then --steps decode steps are timed one by one
(backend.step, the engine call plus binding). The contenders alternate run by run, so load from
elsewhere on a shared machine hits both alike; figures are medians over every timed step of every run.
Each step's CPU time (process_time) is recorded too: with --threads 1 it is the work per step, which
other jobs' load does not inflate (wall time on a shared 2-core machine swings by +-15 % run to run).

The gather cost is measured alone: a graph of just the paged read (Gather + Reshape of every layer's
keys and values, the same shapes as a decode step at that context) run on the same pool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def engine_dirs(work: Path, max_batch: int, max_seq: int, block_size: int) -> dict[str, Path]:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    ckpt = work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    limits = Limits(max_batch=max_batch, max_input_len=max_seq - 1, max_seq_len=max_seq)
    dirs = {}
    for layout in ("slots", "paged"):
        out = work / f"engine-{layout}-b{max_batch}-s{max_seq}-B{block_size}"
        if not out.exists():
            build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                         kv_layout=layout, kv_block_size=block_size))
        dirs[layout] = out
    return dirs


def decode_steps(backend, batch: int, context: int, steps: int, cpu: list[float] | None = None) -> list[float]:
    """Prefill BATCH rows of CONTEXT tokens, then time STEPS decode steps; seconds per step (and each step's
    CPU seconds appended to cpu)."""
    kv = backend.kv
    rng = np.random.default_rng(0)
    slots = [kv.allocate(("bench", r), context, steps + 1) for r in range(batch)]
    try:
        for s in slots:
            backend.step(s, rng.integers(10, 1000, (1, context)))
            kv.advance(s, context)
        ids = rng.integers(10, 1000, (batch, 1))
        times = []
        for _ in range(steps):
            started, cpu_started = time.perf_counter(), time.process_time()
            backend.step(0, ids)
            times.append(time.perf_counter() - started)
            if cpu is not None:
                cpu.append(time.process_time() - cpu_started)
            for s in slots:
                kv.advance(s, 1)
        return times
    finally:
        for s in slots:
            backend.release(s)


def gather_seconds(layout, pool_blocks: int, batch: int, context: int, threads: int | None,
                   repeats: int) -> float:
    """Median time of the paged read alone (every layer's K and V) for BATCH rows of CONTEXT positions."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from engine_builder.runner.ort_backend import session_options

    width = -(-(context + 1) // layout.block_size)
    nodes, outputs = [], []
    pool_shape = list(layout.pool_shape("num_blocks"))  # head-major: [kv_heads, num_blocks, B, head_dim]
    inputs = [helper.make_tensor_value_info("block_table", TensorProto.INT64, ["batch", "w"])]
    shape = helper.make_tensor("shape", TensorProto.INT64, [4], [layout.kv_heads, 0, -1, layout.head_dim])
    for i in range(2 * layout.num_layers):
        inputs.append(helper.make_tensor_value_info(f"pool{i}", TensorProto.FLOAT, pool_shape))
        # a one-element Slice of each gathered cache is the output: the big intermediates are freed and
        # their memory reused layer after layer, as in the decoder, instead of 2 x layers graph outputs
        nodes += [helper.make_node("Gather", [f"pool{i}", "block_table"], [f"g{i}"], axis=1),
                  helper.make_node("Reshape", [f"g{i}", "shape"], [f"r{i}"]),
                  helper.make_node("Slice", [f"r{i}", "zero", "one", "three"], [f"out{i}"])]
        outputs.append(helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, None))
    consts = [shape, *(helper.make_tensor(n, TensorProto.INT64, [1], [v]) for n, v in
                       (("zero", 0), ("one", 1), ("three", 3)))]
    graph = helper.make_graph(nodes, "paged_read", inputs, outputs, initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=12)
    session = ort.InferenceSession(model.SerializeToString(), session_options("float32", threads),
                                   providers=["CPUExecutionProvider"])
    pool = np.zeros(layout.pool_shape(pool_blocks), np.float32)
    table = np.arange(1, batch * width + 1, dtype=np.int64).reshape(batch, width) % pool_blocks
    feed = {"block_table": table, **{f"pool{i}": pool for i in range(2 * layout.num_layers)}}
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(args, dirs: dict[str, Path], max_batch: int, max_seq: int) -> tuple[list[dict], dict]:
    """(a row per batch size, the in-place check): both layouts' decode steps, alternating every run."""
    from engine_builder.runner.engine import EngineDir
    from engine_builder.runner.ort_backend import OrtBackend
    from engine_builder.runner.ort_paged import PagedOrtBackend

    paged_engine = EngineDir.load(dirs["paged"])
    backends = {"slots": OrtBackend(EngineDir.load(dirs["slots"]), threads=args.threads),
                "paged": PagedOrtBackend(paged_engine, threads=args.threads,
                                         kv_cache_memory=paged_engine.twin_paged_layout.bytes_per_block
                                         * (max_batch * -(-max_seq // args.block_size) + 1))}
    steps: dict[tuple[str, int], list[float]] = {(k, b): [] for k in backends for b in args.batch}
    cpu: dict[tuple[str, int], list[float]] = {(k, b): [] for k in backends for b in args.batch}
    for _ in range(args.runs):
        for batch in args.batch:
            for name, backend in backends.items():
                steps[name, batch] += decode_steps(backend, batch, args.context, args.steps, cpu[name, batch])
    layout = paged_engine.twin_paged_layout
    pool_blocks = backends["paged"].kv.pool.num_blocks
    # the in-place check: a 4x larger pool must not slow a step (a copied pool would cost its bytes per step)
    big = PagedOrtBackend(paged_engine, threads=args.threads,
                          kv_cache_memory=layout.bytes_per_block * layout.max_pool_blocks(max_batch))
    small_ms, big_ms = [], []
    for _ in range(args.runs):
        small_ms += decode_steps(backends["paged"], 1, args.context, args.steps)
        big_ms += decode_steps(big, 1, args.context, args.steps)
    in_place = {"pool_blocks": [pool_blocks, big.kv.pool.num_blocks],
                "pool_mib": [backends["paged"].kv.nbytes >> 20, big.kv.nbytes >> 20],
                "bs1_step_ms": [round(statistics.median(small_ms) * 1e3, 3), round(statistics.median(big_ms) * 1e3, 3)]}
    rows = []
    for batch in args.batch:
        slots_ms = statistics.median(steps["slots", batch]) * 1e3
        paged_ms = statistics.median(steps["paged", batch]) * 1e3
        gather_ms = gather_seconds(layout, pool_blocks, batch, args.context, args.threads, 5 * args.steps) * 1e3
        slots_cpu, paged_cpu = (statistics.median(cpu[k, batch]) * 1e3 for k in ("slots", "paged"))
        rows.append({"batch": batch, "context": args.context, "slots_step_ms": round(slots_ms, 3),
                     "paged_step_ms": round(paged_ms, 3), "paged_over_slots": round(paged_ms / slots_ms, 4),
                     "slots_cpu_ms": round(slots_cpu, 3), "paged_cpu_ms": round(paged_cpu, 3),
                     "paged_over_slots_cpu": round(paged_cpu / slots_cpu, 4),
                     "gather_ms_per_step": round(gather_ms, 3)})
    return rows, in_place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", type=Path, default=Path("build/bench-paged"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from spin_policy import same_spinning

    max_batch, max_seq = max(args.batch), args.context + args.steps + 1
    dirs = engine_dirs(args.work, max_batch, max_seq, args.block_size)
    with same_spinning(args.threads) as spinning:  # both layouts' sessions alike, taking turns
        rows, in_place = measure(args, dirs, max_batch, max_seq)
    if args.json:
        print(json.dumps({"rows": rows, "block_size": args.block_size, "runs": args.runs, "steps": args.steps,
                          "in_place": in_place, "spinning": spinning}))
        return
    print(f"SmolLM2-135M float32 twin, context {args.context}, block {args.block_size}, "
          f"medians of {args.runs} x {args.steps} decode steps; spinning {spinning} for both, taking turns")
    print(f"{'batch':>5} {'slots ms':>9} {'paged ms':>9} {'paged/slots':>11} {'cpu paged/slots':>15} "
          f"{'gather ms':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['slots_step_ms']:>9.2f} {r['paged_step_ms']:>9.2f} "
              f"{r['paged_over_slots']:>11.3f} {r['paged_over_slots_cpu']:>15.3f} {r['gather_ms_per_step']:>9.2f}")
    print(f"in place: batch-1 paged step {in_place['bs1_step_ms'][0]:.2f} ms with a {in_place['pool_mib'][0]} MiB "
          f"pool, {in_place['bs1_step_ms'][1]:.2f} ms with {in_place['pool_mib'][1]} MiB")


if __name__ == "__main__":
    main()
