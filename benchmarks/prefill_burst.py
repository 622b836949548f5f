"""Batched prefill under the soak's cut streams, in process: valid clients' latency beside clients that start a
stream and cancel it after its first token, with short prompts prefilled together (SchedulerConfig.batch_prefill,
runner/scheduling/prefill_groups.py) or each in its own engine call.

    .venv/bin/python benchmarks/prefill_burst.py [--seconds 30] [--rounds 2] [--valid-clients 4]
                                                 [--cut-clients 12] [--work build/bench-serve] [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (serve_soak.py's engine: 8 KV slots), the Executor that
`serve` runs, no HTTP: what the server's engine loop does, without the sockets' noise. Valid requests: the
soak's prompts, greedy, 8-32 tokens; cut requests: the same prompts, max 64 tokens, cancelled once their first
token arrives (over HTTP the cancel lands ~1.5 steps later). Each round runs a baseline (valid clients alone),
then both modes, alternating which goes first, so load from elsewhere on a shared machine hits both alike.
First it times the prefill of 2, 3 and 6 of the soak's prompts in one call vs one call each (fastest of 5: what
the work costs, whatever else runs on the machine). Then per mode: the valid requests' p50/p99 latency and
p99 / the baseline's, cut requests served per second, engine steps per second, how many prefills shared a call.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from decode import engine_dirs  # noqa: E402
from serve_soak import PROMPTS  # noqa: E402


def run(llm, seconds: float, valid_clients: int, cut_clients: int, batch_prefill: bool, seed: int) -> dict:
    from engine_builder import SamplingParams
    from engine_builder.executor import Executor, SchedulerConfig

    encoded = [llm.encode(p) for p in PROMPTS]
    latencies: list[float] = []
    cuts = [0]
    deadline = time.monotonic() + seconds

    def valid(i: int) -> None:
        rng = random.Random(seed + i)
        while time.monotonic() < deadline:
            started = time.perf_counter()
            executor.submit(rng.choice(encoded), SamplingParams(max_new_tokens=rng.randint(8, 32))).result()
            latencies.append(time.perf_counter() - started)

    def cut(i: int) -> None:
        rng = random.Random(seed + 100 + i)
        while time.monotonic() < deadline:
            handle = executor.submit(rng.choice(encoded), SamplingParams(max_new_tokens=64))
            next(iter(handle.events()))
            handle.cancel()
            cuts[0] += 1

    with Executor(llm, SchedulerConfig(batch_prefill=batch_prefill)) as executor:
        threads = [threading.Thread(target=valid, args=(i,)) for i in range(valid_clients)]
        threads += [threading.Thread(target=cut, args=(i,)) for i in range(cut_clients)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        stats = executor.stats()
    return {"valid_requests": len(latencies), "valid_p50_s": round(statistics.median(latencies), 3),
            "valid_p99_s": round(statistics.quantiles(latencies, n=100)[98], 3),
            "cut_per_s": round(cuts[0] / elapsed, 1), "steps_per_s": round(stats.steps / elapsed, 1),
            "batched_prefill_calls": stats.batched_prefill_calls,
            "batched_prefill_requests": stats.batched_prefill_requests}


def prefill_cost(llm, prompts: list[str], reps: int) -> dict:
    """Wall time to prefill PROMPTS (and sample each first token) in one shared call vs one call each, the fastest
    of REPS alternating tries (the fastest is what the work costs; slower tries are other load on the machine)."""
    from engine_builder import SamplingParams
    from engine_builder.runner.batched_prefill import prefill_together

    gen = llm.generator
    times: dict[str, list[float]] = {"one_call": [], "per_request": []}
    gen.claim("prefill_burst", "wait for it")
    try:
        for _ in range(reps):
            for mode in times:
                requests = [gen.new_request(i, llm.encode(p), SamplingParams(max_new_tokens=2))
                            for i, p in enumerate(prompts)]
                for r in requests:
                    gen.admit(r)
                events: list = []
                started = time.perf_counter()
                if mode == "one_call":
                    prefill_together(gen, requests, events)
                else:
                    for r in requests:
                        gen.prefill(r, events)
                times[mode].append(time.perf_counter() - started)
                for r in requests:
                    gen.release(r)
    finally:
        gen.unclaim()
    best = {mode: min(t) for mode, t in times.items()}
    return {"prompts": len(prompts), "one_call_ms": round(best["one_call"] * 1e3, 1),
            "per_request_ms": round(best["per_request"] * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--valid-clients", type=int, default=4)
    parser.add_argument("--cut-clients", type=int, default=12)
    parser.add_argument("--work", type=Path, default=Path("build/bench-serve"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--costs-only", action="store_true", help="only the prefill cost comparison")
    parser.add_argument("--engine", type=Path, help="this engine dir instead of the soak's (e.g. one built with "
                        "--kv-layout paged)")
    args = parser.parse_args()
    from engine_builder import LLM

    args.work.mkdir(parents=True, exist_ok=True)
    engine = args.engine or engine_dirs(args.work, ["default"], 8, 64)["default"]
    llm = LLM(engine, backend="onnxruntime", **({"kv_cache_memory": 256 << 20} if args.engine else {}))
    slots = llm.backend.kv.batch_slots
    costs = [prefill_cost(llm, PROMPTS[:n], reps=5) for n in sorted({2, min(3, slots), min(len(PROMPTS), slots)})]
    if not args.json:
        for c in costs:
            print(f"{c['prompts']} soak prompts prefilled: {c['one_call_ms']} ms in one call vs "
                  f"{c['per_request_ms']} ms in one call each (fastest of 5)", flush=True)
    rounds = []
    for i in range(0 if args.costs_only else args.rounds):
        baseline = run(llm, args.seconds, args.valid_clients, 0, True, seed=i)
        modes = {}
        for batched in ((True, False) if i % 2 == 0 else (False, True)):
            modes["batched" if batched else "per_request"] = run(llm, args.seconds, args.valid_clients,
                                                                 args.cut_clients, batched, seed=i)
        for m in modes.values():
            m["p99_ratio"] = round(m["valid_p99_s"] / baseline["valid_p99_s"], 2)
        rounds.append({"baseline": baseline, **modes})
        if not args.json:
            print(f"round {i + 1}: baseline p99 {baseline['valid_p99_s']} s; " + "; ".join(
                f"{name}: p99 {m['valid_p99_s']} s ({m['p99_ratio']}x), p50 {m['valid_p50_s']} s, "
                f"{m['cut_per_s']} cut/s, {m['steps_per_s']} steps/s, {m['batched_prefill_requests']} prefills in "
                f"{m['batched_prefill_calls']} shared calls" for name, m in modes.items()), flush=True)
    if args.json:
        print(json.dumps({"prefill_cost": costs, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
