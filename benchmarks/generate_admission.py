"""LLM.generate by free KV blocks (runner/scheduling/block_admission.py) vs the old admission by free slots.

    .venv/bin/python benchmarks/generate_admission.py [--requests 16] [--max-new-tokens 160] [--rounds 3]
                                                      [--work build/bench-admission] [--json]

SmolLM2-135M fp32 built `--kv-layout paged` (16 slots, max_seq_len 512, blocks of 16), the onnxruntime twin.
Greedy requests on the soak's prompts. Three ways, alternating their order each round so load from elsewhere
hits all alike:
  reserve     the old loop (Generator._run_sampled): a free slot, then prompt + max_new_tokens reserved
              up front, on a pool big enough for every request reserved at once
  blocks      block admission on the same big pool (what it costs per step: the scheduler's Python)
  blocks_small block admission on a pool of 2 full sequences (65 blocks): far too small to reserve for all
              (the old loop raises CapacityError there: tried once, reported), so requests grow and are
              preempted by recompute
Per way: wall seconds (median over rounds), generated tokens/s, the most requests decoding at once, preemptions;
all ways must give the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from serve_soak import PROMPTS  # noqa: E402

BLOCK, MAX_SEQ, SLOTS = 16, 512, 16


def engine(work: Path) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    ckpt, out = work / "ckpt", work / f"engine-paged-b{SLOTS}-s{MAX_SEQ}"
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    if not out.exists():
        build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", kv_layout="paged",
                                     kv_block_size=BLOCK, limits=Limits(SLOTS, 128, MAX_SEQ)))
    return out


def run(llm, prompts: list[list[int]], params, reserve: bool) -> dict:
    gen = llm.generator
    admission, gen.admission = gen.admission, (None if reserve else gen.admission)
    try:
        started = time.perf_counter()
        states, loop = gen.start(prompts, [params] * len(prompts))
        running, peak = set(), 0
        for event in loop:
            running.add(event.request)
            if event.finished:
                running.discard(event.request)
            peak = max(peak, len(running))
        seconds = time.perf_counter() - started
    finally:
        gen.admission = admission
    tokens = sum(len(r.token_ids) for r in states)
    preemptions = 0 if reserve else admission.scheduler.resumes.preemptions
    return {"seconds": seconds, "tok_s": tokens / seconds, "peak_running": peak, "preemptions": preemptions,
            "tokens": [tuple(r.token_ids) for r in states]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("build/bench-admission"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_builder import LLM, SamplingParams
    from engine_builder.util.errors import CapacityError

    args.work.mkdir(parents=True, exist_ok=True)
    path = engine(args.work)
    probe = LLM(path, prefix_cache=False, kv_cache_memory=64 << 20)
    per_block = probe.backend.layout.bytes_per_block
    probe.close()
    big = LLM(path, prefix_cache=False, kv_cache_memory=(SLOTS * MAX_SEQ // BLOCK + 1) * per_block)
    small = LLM(path, prefix_cache=False, kv_cache_memory=(2 * MAX_SEQ // BLOCK + 1) * per_block)
    prompts = [big.encode(f"{PROMPTS[i % len(PROMPTS)]} (note {i})") for i in range(args.requests)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)
    ways = {"reserve": (big, True), "blocks": (big, False), "blocks_small": (small, False)}
    results: dict[str, list[dict]] = {w: [] for w in ways}
    for i in range(args.rounds):
        order = list(ways) if i % 2 == 0 else list(reversed(ways))
        for way in order:
            llm, reserve = ways[way]
            results[way].append(run(llm, prompts, params, reserve))
    try:  # the old loop on the small pool: reserving prompt + max_new_tokens for each admitted request
        run(small, prompts, params, reserve=True)
        small_reserve = "ran"
    except CapacityError as exc:
        small_reserve = f"CapacityError: {exc}"
    want = results["reserve"][0]["tokens"]
    same = all(r["tokens"] == want for rs in results.values() for r in rs)
    summary = {way: {"seconds": round(statistics.median(r["seconds"] for r in rs), 2),
                     "tok_s": round(statistics.median(r["tok_s"] for r in rs), 1),
                     "peak_running": max(r["peak_running"] for r in rs),
                     "preemptions": max(r["preemptions"] for r in rs),
                     "each_round_s": [round(r["seconds"], 2) for r in rs]} for way, rs in results.items()}
    summary["pool_blocks"] = {"big": big.backend.kv.pool.num_blocks, "small": small.backend.kv.pool.num_blocks}
    summary["identical_tokens"] = same
    summary["reserve_on_small_pool"] = small_reserve
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for way in ways:
            s = summary[way]
            print(f"{way:13s} {s['seconds']:7.2f} s  {s['tok_s']:7.1f} tok/s  peak {s['peak_running']:2d} decoding  "
                  f"{s['preemptions']} preemptions  (rounds: {s['each_round_s']} s)")
        print(f"pools: {summary['pool_blocks']}; identical tokens: {same}")
        print(f"reserve on the small pool: {small_reserve}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
