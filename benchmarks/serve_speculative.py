"""Speculative decoding as `trtbuild serve --speculative ngram` runs it (the Executor, no HTTP), and prompt
logprobs (OpenAI echo + logprobs, lm-eval's loglikelihood) scored logits_tail positions per engine call.

    .venv/bin/python benchmarks/serve_speculative.py [--runs 3] [--requests 4] [--max-new-tokens 96]
                                                     [--work DIR] [--threads N] [--json]

SmolLM2-135M-Instruct, float32 onnxruntime twin (max_batch 4), greedy; medians over --runs after one
warm-up, runs interleaved so load changes hit every contender alike.

  serve   --requests copy/edit requests (each repeats its own paragraph) submitted at once to an Executor:
          plain decoding, ngram verifying each request in its own engine step (row by row, the way the
          previous version ran), and ngram verifying all drafted requests in one step (batched). Every
          speculative run's tokens are checked identical to the plain ones (the script fails otherwise).
  scoring a 480-token prompt's logprobs (prompt_logprobs=1): 16 positions per engine call vs one per call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARAGRAPHS = [
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed the "
    "narrow stairs, polished the great lens and lit the lamp, so that ships could find their way home.",
    "A small bakery on the corner of the market square opens at five every morning. The smell of fresh bread "
    "fills the street, and by seven the first customers are already waiting at the door.",
    "The river winds through the valley for forty miles before it reaches the sea. In spring it floods the "
    "meadows, and in summer children swim in the deep pools beneath the old stone bridge.",
    "Our team meets every Monday to plan the week. We review the open tasks, agree on priorities, and make "
    "sure that everyone knows who is responsible for each part of the project.",
]


def build_engine(work: Path) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    ckpt, engine = work / "ckpt-float32", work / "engine-float32-b4"
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    if not engine.exists():
        build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                        limits=Limits(max_batch=4, max_input_len=512, max_seq_len=1024)))
    return engine


def run_executor(llm, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[int, ...]]:
    from engine_builder import SamplingParams
    from engine_builder.executor import Executor

    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
    with Executor(llm) as executor:
        handles = [executor.submit(ids, params) for ids in prompts]
        return [h.result().token_ids for h in handles]


def serve_part(engine: Path, runs: int, requests: int, max_new_tokens: int, threads: int | None) -> dict:
    from spin_policy import same_spinning

    from engine_builder import LLM
    from engine_builder.runner.speculative import SpeculativeConfig

    with same_spinning(threads):  # the three sessions alike (else only the first opened spins), taking turns
        plain = LLM(engine, threads=threads)
        row = LLM(engine, threads=threads, speculative=SpeculativeConfig("ngram"))
        batched = LLM(engine, threads=threads, speculative=SpeculativeConfig("ngram"))
    row.generator._fits_together = lambda drafted: False  # the previous behaviour: one engine step per request
    prompts = [plain.encode_chat([{"role": "user", "content": "Repeat this paragraph exactly, word for word:\n\n"
                                                              + PARAGRAPHS[i % len(PARAGRAPHS)]}])
               for i in range(requests)]
    contenders = {"plain": plain, "ngram_row_by_row": row, "ngram_batched": batched}
    for llm in contenders.values():
        run_executor(llm, prompts, max_new_tokens)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in contenders}
    tokens: dict[str, list] = {}
    for _ in range(runs):
        for name, llm in contenders.items():
            started = time.perf_counter()
            tokens[name] = run_executor(llm, prompts, max_new_tokens)
            times[name].append(time.perf_counter() - started)
    for name in ("ngram_row_by_row", "ngram_batched"):
        assert tokens[name] == tokens["plain"], f"{name} changed the greedy tokens"
    med = {name: statistics.median(t) for name, t in times.items()}
    new = requests * max_new_tokens
    return {"requests": requests, "new_tokens": new, **{f"{k}_s": round(v, 3) for k, v in med.items()},
            **{f"{k}_tok_s": round(new / v, 1) for k, v in med.items()},
            "batched_vs_plain": round(med["ngram_batched"] / med["plain"], 3),
            "batched_vs_row_by_row": round(med["ngram_batched"] / med["ngram_row_by_row"], 3),
            "stats_batched": batched.speculation.stats.to_json(), "stats_row_by_row": row.speculation.stats.to_json()}


def scoring_part(engine: Path, runs: int, threads: int | None) -> dict:
    from engine_builder import LLM, SamplingParams

    llm = LLM(engine, threads=threads)
    ids = llm.encode(" ".join(PARAGRAPHS * 4))[:480]
    params = SamplingParams(max_new_tokens=1, temperature=0, prompt_logprobs=1)
    tail = llm.backend.logits_tail
    out: dict[str, object] = {"prompt_tokens": len(ids)}
    results = {}
    times: dict[int, list[float]] = {tail: [], 1: []}
    for _ in range(runs + 1):  # the first of each is a warm-up
        for per_call in (tail, 1):
            llm.backend.logits_tail = per_call  # 1: the engine's steps as an engine built before logits_tail
            started = time.perf_counter()
            results[per_call] = llm.generate(prompt_token_ids=[ids], params=params)[0].prompt_logprobs
            times[per_call].append(time.perf_counter() - started)
    llm.backend.logits_tail = tail
    worst = max(abs(a.logprob - b.logprob) for a, b in zip(results[tail][1:], results[1][1:]))
    t_tail, t_one = statistics.median(times[tail][1:]), statistics.median(times[1][1:])
    out.update({f"per_call_{tail}_s": round(t_tail, 3), "per_call_1_s": round(t_one, 3),
                "speedup": round(t_one / t_tail, 2), "max_logprob_difference": worst})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--work", type=Path, default=Path("build/bench-serve-speculative"))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    engine = build_engine(args.work)
    result = {"serve": serve_part(engine, args.runs, args.requests, args.max_new_tokens, args.threads),
              "scoring": scoring_part(engine, args.runs, args.threads)}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
