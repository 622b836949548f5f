"""Where a decode step's time goes in an engine dir's onnxruntime twin: onnxruntime's profiler, per op type.

    python benchmarks/ort_op_profile.py ENGINE_DIR [ENGINE_DIR ...] [--tokens 64] [--threads N] [--top 12]
                                        [--context N] [--batch N]

Opens each dir on the onnxruntime backend exactly as `LLM` does (same session options, IO binding),
with onnxruntime's profiler on, decodes --tokens greedy tokens after a short prompt (or, with --context,
--batch rows of N random token ids each: a decode step at a realistic context), and sums the
profiler's kernel times of the decode steps (prefill left out) per op type: ms per token, share of
the kernels' total, and node count per step. "other" is the step's wall time outside kernels
(onnxruntime's executor, the binding, the sampler and detokenizer in Python).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profiled_llm(engine: Path, threads: int | None):
    """LLM(engine) on onnxruntime exactly as users get it, with onnxruntime's profiler on (end_profiling()
    on llm.backend.session gives the trace's path)."""
    import engine_builder.runner.ort_backend as ort_backend
    from engine_builder import LLM

    plain = ort_backend.session_options

    def with_profiler(*args, **kwargs):
        options = plain(*args, **kwargs)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path("/tmp") / f"ort-profile-{engine.name}")
        return options

    ort_backend.session_options = with_profiler
    try:
        return LLM(engine, backend="onnxruntime", threads=threads)
    finally:
        ort_backend.session_options = plain


def profile(engine: Path, tokens: int, threads: int | None, context: int | None = None, batch: int = 1) -> dict:
    from engine_builder import SamplingParams

    llm = profiled_llm(engine, threads)
    params = SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
    if context is None:
        prompts = [llm.encode("The capital of France is")] * batch
    else:  # distinct rows, so no prefix cache shares them
        import numpy as np
        rng = np.random.default_rng(0)
        prompts = [rng.integers(10, 1000, context).tolist() for _ in range(batch)]
    started = time.perf_counter()
    llm.generate(prompt_token_ids=prompts, params=params)
    wall = time.perf_counter() - started
    path = llm.backend.session.end_profiling()
    events = json.loads(Path(path).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    decode_runs = runs[1:][-(tokens - 1):]  # the prefill run(s) come first; then tokens - 1 decode steps
    first = decode_runs[0]["ts"] if decode_runs else 0
    per_op: dict[str, float] = collections.defaultdict(float)
    nodes: dict[str, int] = collections.defaultdict(int)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            op = e["args"].get("op_name", "?")
            per_op[op] += e["dur"] / 1000
            nodes[op] += 1
    steps = max(len(decode_runs), 1)
    run_ms = sum(r["dur"] for r in decode_runs) / 1000 / steps
    kernels = sum(per_op.values()) / steps
    Path(path).unlink()
    return {"engine": str(engine), "wall_ms_per_token": wall * 1000 / tokens, "run_ms_per_step": run_ms,
            "kernel_ms_per_step": kernels,
            "ops": {op: {"ms": ms / steps, "share": ms / steps / kernels, "nodes": nodes[op] // steps}
                    for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engines", nargs="+", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--context", type=int, default=None, help="random prompts of this many tokens")
    parser.add_argument("--batch", type=int, default=1, help="rows decoded together")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [profile(e, args.tokens, args.threads, args.context, args.batch) for e in args.engines]
    if args.json:
        print(json.dumps(results))
        return
    for r in results:
        print(f"{r['engine']}: {r['wall_ms_per_token']:.2f} ms/token wall, {r['run_ms_per_step']:.2f} ms/step in "
              f"onnxruntime, {r['kernel_ms_per_step']:.2f} ms in kernels")
        for op, o in list(r["ops"].items())[:args.top]:
            print(f"  {op:<28} {o['ms']:>7.3f} ms {o['share']:>6.1%} {o['nodes']:>5} nodes")


if __name__ == "__main__":
    main()
