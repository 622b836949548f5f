"""In-flight batching throughput: N requests submitted to the Executor at once vs the same N one after another.

    .venv/bin/python benchmarks/executor_throughput.py [--engine DIR] [--requests 8] [--new-tokens 64]
                                                       [--runs 3] [--threads N] [--work DIR] [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (built from the bundled GGUF into --work, a temp
dir by default, unless --engine names one with max_batch >= --requests). Greedy, EOS ignored, so
every request generates exactly --new-tokens tokens. tok/s = generated tokens / wall time from the
first submit to the last result. "sequential" submits each request after the previous one finished
(the same executor, so the same code path at concurrency 1); "concurrent" submits all N at once.
Each run times both, alternating which goes first, so load from elsewhere on a shared machine hits
both alike; the figures are medians over --runs. Both must give the same tokens per prompt (checked).
Issue 7 asks for concurrent >= 3x sequential at concurrency 8.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode import PROMPTS, engine_dirs  # noqa: E402  (the decode benchmark's prompts and engine build)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, default=None, help="engine dir (default: build one in --work)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: physical cores)")
    parser.add_argument("--work", type=Path, default=None, help="where to build the engine (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp:
        engine = args.engine
        if engine is None:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            print(f"building the SmolLM2 fp32 engine in {work} ...", file=sys.stderr, flush=True)
            engine = engine_dirs(work, ["default"], args.requests, args.new_tokens)["default"]
        result = measure(engine, args)

    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.requests} requests x {args.new_tokens} tokens: concurrent {result['concurrent_tok_s']:.1f} tok/s "
          f"vs sequential {result['sequential_tok_s']:.1f} tok/s = {result['ratio']:.2f}x "
          f"(median of {args.runs}; {result['steps_concurrent']} steps vs {result['steps_sequential']})")


def measure(engine: Path, args: argparse.Namespace) -> dict:
    from engine_builder import LLM, SamplingParams
    from engine_builder.executor import Executor, SchedulerConfig

    llm = LLM(engine, backend="onnxruntime", threads=args.threads)
    prompts = [llm.encode(p) for p in (PROMPTS * args.requests)[:args.requests]]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0, ignore_eos=True)

    with Executor(llm, SchedulerConfig(max_batch=args.requests)) as executor:
        def sequential() -> tuple[float, list]:
            started = time.perf_counter()
            outs = [executor.submit(ids, params).result() for ids in prompts]
            return time.perf_counter() - started, outs

        def concurrent() -> tuple[float, list]:
            started = time.perf_counter()
            handles = [executor.submit(ids, params) for ids in prompts]
            outs = [h.result() for h in handles]
            return time.perf_counter() - started, outs

        executor.submit(prompts[0], SamplingParams(max_new_tokens=4, temperature=0)).result()  # warm-up
        tokens = len(prompts) * args.new_tokens
        samples: dict[str, list[float]] = {"sequential": [], "concurrent": []}
        steps: dict[str, int] = {}
        reference = None
        for run in range(args.runs):
            order = [("sequential", sequential), ("concurrent", concurrent)]
            for name, fn in order if run % 2 == 0 else order[::-1]:
                before = executor.stats().steps
                seconds, outs = fn()
                steps[name] = executor.stats().steps - before
                samples[name].append(tokens / seconds)
                ids = [o.token_ids for o in outs]
                assert all(len(t) == args.new_tokens for t in ids)
                if reference is None:
                    reference = ids
                assert ids == reference, f"{name} run {run + 1} gave other tokens than the first run"
            print(f"run {run + 1}/{args.runs}: concurrent {samples['concurrent'][-1]:.1f} tok/s, "
                  f"sequential {samples['sequential'][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    llm.close()

    concurrent_tok_s = statistics.median(samples["concurrent"])
    sequential_tok_s = statistics.median(samples["sequential"])
    return {"requests": args.requests, "new_tokens": args.new_tokens, "runs": args.runs,
            "concurrent_tok_s": round(concurrent_tok_s, 2), "sequential_tok_s": round(sequential_tok_s, 2),
            "ratio": round(concurrent_tok_s / sequential_tok_s, 2),
            "steps_concurrent": steps["concurrent"], "steps_sequential": steps["sequential"]}


if __name__ == "__main__":
    main()
