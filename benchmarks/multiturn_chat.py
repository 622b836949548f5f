"""Multi-turn chat throughput with the prefix cache on (default) and off (`--no-prefix-cache`): synthetic
10-turn conversations, 8 at a time, all opening with the same system prompt.

    .venv/bin/python benchmarks/multiturn_chat.py [--conversations 8] [--turns 10] [--system-tokens 256] [--json]

An Executor (what `trtbuild serve` runs) on SmolLM2 fp32 (onnxruntime, CPU), one thread per conversation:
each turn sends the whole history through the chat template (as an OpenAI client does), waits for the
greedy answer (at most --answer-tokens), appends it and asks the next question. Throughput = generated
tokens / wall time of the whole workload; the prefill figures count prompt tokens computed vs reused.
Both runs' conversations are compared: greedy answers must be identical. Target (issue 17): >= 2x the
no-prefix-cache run. `--modes ...,no_prefix_cache_unchunked` adds the no-cache run with whole-prompt prefill
steps (--max-num-batched-tokens 2048), the fastest baseline for this prefill-bound workload.

llama.cpp's prompt cache (llama-cpp-python with LlamaRAMCache) on the same workload runs when
llama_cpp is importable (it is not a dependency: its wheel compiles llama.cpp for many minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from sched_common import engine_arg, smollm2_engine, text_of_tokens

# name -> (prefix cache, prefill budget per step: None = auto, the default; 2048 = whole prompts, no chunking)
MODES = {"prefix_cache": (True, None), "no_prefix_cache": (False, None), "no_prefix_cache_unchunked": (False, 2048)}


def question(conv: int, turn: int) -> str:
    topics = ("the harbour", "the old mill", "the winter fair", "the lighthouse", "the market", "the river",
              "the library", "the orchard")
    return f"Question {turn + 1} about {topics[conv % len(topics)]}: what happens next there? Answer briefly."


def run_workload(llm, conversations: int, turns: int, system: str, answer_tokens: int,
                 budget: int | None = None) -> dict:
    from engine_builder.executor import Executor, SchedulerConfig

    params = llm.default_params(max_new_tokens=answer_tokens, temperature=0)
    histories: list[list[dict]] = [[{"role": "system", "content": system}] for _ in range(conversations)]
    counts = {"prompt_tokens": 0, "generated_tokens": 0}
    lock = threading.Lock()

    def converse(c: int) -> None:
        for t in range(turns):
            histories[c].append({"role": "user", "content": question(c, t)})
            ids = llm.encode_chat(histories[c])
            out = executor.submit(ids, params).result(timeout=3600)
            histories[c].append({"role": "assistant", "content": out.text})
            with lock:
                counts["prompt_tokens"] += len(ids)
                counts["generated_tokens"] += len(out.token_ids)

    cache = llm.generator.prefix_cache
    hits_before = cache.stats().hit_tokens if cache is not None else 0
    with Executor(llm, SchedulerConfig(max_tokens_per_step=budget)) as executor:
        started = time.perf_counter()
        threads = [threading.Thread(target=converse, args=(c,)) for c in range(conversations)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        seconds = time.perf_counter() - started
    reused = (cache.stats().hit_tokens - hits_before) if cache is not None else 0
    return {"seconds": round(seconds, 2), "tokens_per_s": round(counts["generated_tokens"] / seconds, 2),
            **counts, "reused_prompt_tokens": reused, "histories": histories}


def run_llama_cpp(conversations: int, turns: int, system: str, answer_tokens: int) -> dict | None:
    try:
        import llama_cpp
    except ImportError:
        return None
    from engine_builder.util.bundled import smollm2_gguf

    model = llama_cpp.Llama(str(smollm2_gguf()), n_ctx=2048, verbose=False)
    model.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=2 << 30))
    histories = [[{"role": "system", "content": system}] for _ in range(conversations)]
    generated, started = 0, time.perf_counter()
    for t in range(turns):  # one model, no batching: the conversations take turns
        for c in range(conversations):
            histories[c].append({"role": "user", "content": question(c, t)})
            out = model.create_chat_completion(histories[c], max_tokens=answer_tokens, temperature=0)
            histories[c].append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
            generated += out["usage"]["completion_tokens"]
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "tokens_per_s": round(generated / seconds, 2), "generated_tokens": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--system-tokens", type=int, default=256)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--modes", default="prefix_cache,no_prefix_cache",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--json", action="store_true")
    engine_arg(parser)
    args = parser.parse_args()
    from engine_builder import LLM

    engine = smollm2_engine(args.engine)
    result: dict = {"conversations": args.conversations, "turns": args.turns, "system_tokens": args.system_tokens}
    histories = {}
    for name in args.modes.split(","):
        prefix_cache, budget = MODES[name]
        llm = LLM(engine, prefix_cache=prefix_cache, prefix_cache_bytes=1 << 30)
        system = text_of_tokens(llm.tokenizer, args.system_tokens)
        r = run_workload(llm, args.conversations, args.turns, system, args.answer_tokens, budget)
        llm.close()
        histories[name] = r.pop("histories")
        result[name] = r
        print(f"{name}: {r}", file=sys.stderr, flush=True)
    if "prefix_cache" in result and "no_prefix_cache" in result:
        result["speedup"] = round(result["prefix_cache"]["tokens_per_s"] / result["no_prefix_cache"]["tokens_per_s"],
                                  2)
        result["answers_identical"] = histories["prefix_cache"] == histories["no_prefix_cache"]
    if "no_prefix_cache_unchunked" in histories and "prefix_cache" in histories:
        result["answers_identical_unchunked"] = histories["prefix_cache"] == histories["no_prefix_cache_unchunked"]
    result["llama_cpp_ram_cache"] = run_llama_cpp(args.conversations, args.turns, system, args.answer_tokens)
    if args.json or "speedup" not in result:
        print(json.dumps(result, indent=2))
    else:
        p, n = result["prefix_cache"], result["no_prefix_cache"]
        print(f"{args.conversations} x {args.turns}-turn conversations, shared ~{args.system_tokens}-token system "
              f"prompt: {p['tokens_per_s']:.1f} tok/s with the prefix cache ({p['seconds']:.0f}s, "
              f"{p['reused_prompt_tokens']}/{p['prompt_tokens']} prompt tokens reused) vs {n['tokens_per_s']:.1f} "
              f"tok/s without ({n['seconds']:.0f}s): {result['speedup']:.2f}x; answers identical: "
              f"{result['answers_identical']}")
        lc = result["llama_cpp_ram_cache"]
        print("llama-cpp-python + LlamaRAMCache: " + (f"{lc['tokens_per_s']:.1f} tok/s ({lc['seconds']:.0f}s)" if lc
                                                      else "not installed (skipped)"))


if __name__ == "__main__":
    main()
