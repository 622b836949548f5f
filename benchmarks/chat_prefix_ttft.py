"""Time to first token of a chat request whose ~1,000-token system prompt the server has seen before,
÷ the same request cold; answers checked identical to the no-prefix-cache path.

    .venv/bin/python benchmarks/chat_prefix_ttft.py [--system-tokens 1000] [--runs 3] [--engine DIR] [--json]

Through the serving path (an Executor, what `trtbuild serve` runs) on SmolLM2 fp32 (onnxruntime, CPU):
per run a fresh system prompt; cold = its first request on the prefix-cached executor, warm = a second
question under the same system prompt on it, and the same warm request on a `--no-prefix-cache`
executor, side by side. Greedy, 24 new tokens; medians over the runs. Target (issue 17): warm / cold
<= 0.2.
"""

from __future__ import annotations

import argparse
import json
import sys

from sched_common import engine_arg, median, smollm2_engine, text_of_tokens

QUESTIONS = ("Who speaks first in this text?", "Summarize the scene in one short line.")


def ttft_and_answer(executor, llm, system: str, question: str) -> tuple[float, tuple[int, ...]]:
    ids = llm.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": question}])
    handle = executor.submit(ids, llm.default_params(max_new_tokens=24, temperature=0))
    out = handle.result()
    return handle.first_token_time - handle.arrival_time, out.token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    engine_arg(parser)
    args = parser.parse_args()
    from engine_builder import LLM
    from engine_builder.executor import Executor

    engine = smollm2_engine(args.engine)
    cached_llm, plain_llm = LLM(engine, prefix_cache=True), LLM(engine, prefix_cache=False)
    times: dict[str, list[float]] = {"cold": [], "warm_cached": [], "warm_no_cache": []}
    identical = True
    with Executor(cached_llm) as cached, Executor(plain_llm) as plain:
        for run in range(args.runs):
            system = text_of_tokens(cached_llm.tokenizer, args.system_tokens, start_word=run * 1200)
            cold, _ = ttft_and_answer(cached, cached_llm, system, QUESTIONS[0])
            warm, answer = ttft_and_answer(cached, cached_llm, system, QUESTIONS[1])
            warm_plain, want = ttft_and_answer(plain, plain_llm, system, QUESTIONS[1])
            identical &= answer == want
            for key, value in zip(times, (cold, warm, warm_plain)):
                times[key].append(value)
            print(f"run {run + 1}/{args.runs}: cold {cold:.3f}s, warm {warm:.3f}s, warm without the cache "
                  f"{warm_plain:.3f}s, same answer {answer == want}", file=sys.stderr, flush=True)
        stats = cached_llm.generator.prefix_cache.stats()
    med = {k: round(median(v), 4) for k, v in times.items()}
    result = {"system_tokens": args.system_tokens, "runs": args.runs, "ttft_s": med,
              "warm_over_cold": round(med["warm_cached"] / med["cold"], 3),
              "warm_over_cold_no_cache": round(med["warm_no_cache"] / med["cold"], 3),
              "answers_identical": identical, "reused_tokens": stats.hit_tokens}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"~{args.system_tokens}-token system prompt seen before, time to first token (medians of {args.runs}): "
              f"cold {med['cold']:.2f}s, warm {med['warm_cached']:.2f}s = {result['warm_over_cold']:.3f}x cold "
              f"(without the prefix cache {med['warm_no_cache']:.2f}s = {result['warm_over_cold_no_cache']:.2f}x); "
              f"answers identical: {identical}")


if __name__ == "__main__":
    main()
