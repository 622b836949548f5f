"""Decode step time of several engine dirs (slot or paged layout) measured step by step in turn.

    .venv/bin/python benchmarks/paged_kv_ab.py BASELINE_DIR OTHER_DIR [...] [--batch 1 8] [--context 256]
                                               [--steps 32] [--rounds 7] [--threads 2] [--json]

benchmarks/paged_kv.py alternates its two contenders every 32 steps; on a shared machine whose load
swings within seconds that still leaves +-10 % between them. Here every engine is prefilled once per
round, then the engines take one decode step each in turn (A, B, C, A, B, C, ...), so each step of one
meets the same load as its neighbours of the others; the figure per engine is the median over every
round of (its step time / the baseline's step time in the same turn), wall and CPU (process_time).
Useful to compare two builds of the paged graph against the slot layout on the same load, e.g.
`benchmarks/paged_kv_ab.py build/bench-paged/engine-slots-b8-s289-B16 OLD/engine-paged-... NEW/engine-paged-...`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def open_backend(path: Path, threads: int | None, rows: int, max_seq: int):
    from engine_builder.runner.engine import EngineDir
    from engine_builder.runner.ort_backend import OrtBackend
    from engine_builder.runner.ort_paged import PagedOrtBackend

    engine = EngineDir.load(path)
    if engine.kv_layout_kind == "paged":
        layout = engine.twin_paged_layout
        memory = layout.bytes_per_block * (rows * -(-max_seq // layout.block_size) + 1)
        return PagedOrtBackend(engine, threads=threads, kv_cache_memory=memory)
    return OrtBackend(engine, threads=threads)


def interleaved(backends: list, batch: int, context: int, steps: int) -> tuple[list[list[float]], list[list[float]]]:
    """One round: prefill BATCH rows of CONTEXT tokens in every backend, then STEPS decode steps taken in
    turn; (wall, cpu) seconds per step, one list per backend."""
    rng = np.random.default_rng(0)
    prompts = rng.integers(10, 1000, (batch, context))
    ids = rng.integers(10, 1000, (batch, 1))
    slots = []
    for backend in backends:
        rows = [backend.kv.allocate(("ab", r), context, steps + 1) for r in range(batch)]
        for s, prompt in zip(rows, prompts):
            backend.step(s, prompt[None])
            backend.kv.advance(s, context)
        slots.append(rows)
    wall: list[list[float]] = [[] for _ in backends]
    cpu: list[list[float]] = [[] for _ in backends]
    try:
        for _ in range(steps):
            for i, backend in enumerate(backends):
                started, cpu_started = time.perf_counter(), time.process_time()
                backend.step(0, ids)
                wall[i].append(time.perf_counter() - started)
                cpu[i].append(time.process_time() - cpu_started)
                for s in slots[i]:
                    backend.kv.advance(s, 1)
    finally:
        for backend, rows in zip(backends, slots):
            for s in rows:
                backend.release(s)
    return wall, cpu


def measure(args) -> tuple[list[dict], list[float]]:
    """(a row per batch size and engine, the load average before and after each batch size)."""
    max_seq = args.context + args.steps + 1
    backends = [open_backend(e, args.threads, max(args.batch), max_seq) for e in args.engines]
    load = [os.getloadavg()[0]]
    rows = []
    for batch in args.batch:
        wall: list[list[float]] = [[] for _ in backends]
        cpu: list[list[float]] = [[] for _ in backends]
        for _ in range(args.rounds):
            w, c = interleaved(backends, batch, args.context, args.steps)
            for i in range(len(backends)):
                wall[i] += w[i]
                cpu[i] += c[i]
        for i, engine in enumerate(args.engines):
            rows.append({"batch": batch, "engine": str(engine), "wall_ms": round(statistics.median(wall[i]) * 1e3, 3),
                         "cpu_ms": round(statistics.median(cpu[i]) * 1e3, 3),
                         "wall_ratio": round(statistics.median(a / b for a, b in zip(wall[i], wall[0])), 4),
                         "cpu_ratio": round(statistics.median(a / b for a, b in zip(cpu[i], cpu[0])), 4)})
        load.append(os.getloadavg()[0])
    return rows, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", nargs="+", type=Path, help="the first is the baseline")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from spin_policy import same_spinning

    with same_spinning(args.threads) as spinning:  # every engine's session alike, taking turns
        rows, load = measure(args)
    if args.json:
        print(json.dumps({"rows": rows, "load_average": load, "threads": args.threads, "rounds": args.rounds,
                          "steps": args.steps, "context": args.context,
                          "spinning": spinning}))
        return
    print(f"context {args.context}, {args.rounds} rounds x {args.steps} steps in turn, {args.threads} threads "
          f"(spinning {spinning}, taking turns), "
          f"load average {' -> '.join(f'{x:.1f}' for x in load)}; ratios: median of per-turn step / baseline step")
    for r in rows:
        print(f"bs{r['batch']:<2} {r['engine']:<60} wall {r['wall_ms']:8.2f} ms ({r['wall_ratio']:.3f})  "
              f"cpu {r['cpu_ms']:8.2f} ms ({r['cpu_ratio']:.3f})")


if __name__ == "__main__":
    main()
