"""Time to first token of a chat request whose long system prompt the engine has just seen, with and
without prefix reuse (LLM(..., prefix_cache=True), engine_builder/runner/kv/prefix_cache.py).

    .venv/bin/python benchmarks/prefix_cache.py [--system-tokens 1000] [--runs 3] [--json]

SmolLM2-135M-Instruct fp32 onnxruntime twin, one engine, greedy, 1 new token. Each run: a cold
request (a fresh system prompt: nothing to reuse) then a warm one (the same system prompt, another
user turn), on the cached LLM and on a plain one alternately; medians. The warm request on the plain
LLM is the baseline a user has today (issue 17 measured it at 0.99x the cold one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the repo root ahead of benchmarks/ (whose passes.py would shadow the passes package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_engine(work: Path, max_input_len: int) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    ckpt, engine = work / "ckpt", work / f"engine-{max_input_len}"
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    if not engine.exists():
        build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                        limits=Limits(max_batch=1, max_input_len=max_input_len,
                                                      max_seq_len=max_input_len + 16)))
    return engine


def system_prompts(tokenizer, tokens: int, runs: int) -> list[str]:
    """RUNS different system prompts of about TOKENS tokens each, from the shipped public-domain text."""
    from engine_builder.util.text_files import builtin_text

    words = builtin_text("eval.txt").text.split()
    out, start = [], 0
    for _ in range(runs):
        end = start + 1
        while len(tokenizer(" ".join(words[start:end])).input_ids) < tokens:
            end += 50
        out.append(" ".join(words[start:end]))
        start = end
    return out


def ttft(llm, system: str, question: str) -> float:
    from engine_builder import SamplingParams

    ids = llm.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": question}])
    started = time.perf_counter()
    llm.generate(prompt_token_ids=[ids], params=SamplingParams(max_new_tokens=1, temperature=0))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="where to build the engine (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engine_builder import LLM

    with tempfile.TemporaryDirectory(prefix="trtbuild-bench-prefix-") as tmp:
        work = args.work or Path(tmp)
        engine = build_engine(work, max_input_len=args.system_tokens + 128)
        from spin_policy import same_spinning

        with same_spinning(None):  # both sessions alike (else only the first opened spins), taking turns
            plain, cached = LLM(engine, prefix_cache=False), LLM(engine, prefix_cache=True)
        times: dict[str, list[float]] = {"plain_cold": [], "plain_warm": [], "cached_cold": [], "cached_warm": []}
        for run, system in enumerate(system_prompts(plain.tokenizer, args.system_tokens, args.runs)):
            for name, llm in (("plain", plain), ("cached", cached)):
                times[f"{name}_cold"].append(ttft(llm, system, "Who speaks first?"))
                times[f"{name}_warm"].append(ttft(llm, system, "Summarize the scene in one line."))
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()),
                  file=sys.stderr, flush=True)
        med = {k: round(statistics.median(v), 4) for k, v in times.items()}
        stats = cached.generator.prefix_cache.stats()
        result = {"system_tokens": args.system_tokens, "runs": args.runs, "ttft_s": med,
                  "warm_over_cold_plain": round(med["plain_warm"] / med["plain_cold"], 3),
                  "warm_over_cold_cached": round(med["cached_warm"] / med["cached_cold"], 3),
                  "speedup_warm_cached_vs_plain": round(med["plain_warm"] / med["cached_warm"], 2),
                  "cached_tokens": stats.hit_tokens, "cache_bytes": stats.bytes}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"~{args.system_tokens}-token system prompt, time to first token (medians of {args.runs}): "
              f"cold {med['plain_cold']:.2f}s; warm without prefix reuse {med['plain_warm']:.2f}s "
              f"({result['warm_over_cold_plain']:.2f}x cold); warm with it {med['cached_warm']:.2f}s "
              f"({result['warm_over_cold_cached']:.2f}x cold, {result['speedup_warm_cached_vs_plain']:.1f}x faster)")


if __name__ == "__main__":
    main()
