"""Generation throughput: `LLM.generate` on the onnxruntime twin vs Hugging Face `generate`.

    .venv/bin/python benchmarks/decode.py [--runs 3] [--new-tokens 128] [--batch 1 8] [--threads N]
                                          [--graph default gqa] [--work build/bench-decode] [--json]

SmolLM2-135M-Instruct (the bundled GGUF) in float32 on CPU, greedy, the same prompts for both,
128 new tokens per sequence (EOS ignored by us, suppressed by HF's min_new_tokens, so both do the
same number of steps). tok/s = generated tokens / wall time of the whole generate call (prefill
included), for batch 1 and batch 8. Every run alternates the contenders (ours, HF, per batch size)
so load from elsewhere on a shared machine hits all alike; the figures are medians over --runs.

Both use the same number of CPU threads (--threads, default the physical cores). On a machine
shared with other busy processes, spin-waiting thread pools (OpenMP in torch, onnxruntime's) can
collapse with 2+ threads; run with --threads 1 too and compare before drawing conclusions.

--graph picks the onnxruntime pass list of the engine: "default" (DEFAULT_PASSES) and/or "gqa"
(+ lower_ort_attention: com.microsoft GroupQueryAttention with an in-place shared KV buffer).
Also printed: the share of decode-step time spent outside the backend's execute call (sampling,
stop checks, detokenization, binding), from the runner's own Timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = [
    "The capital of France is", "Write a short poem about the sea.", "def quicksort(items):",
    "Explain photosynthesis in simple terms.", "Once upon a time, in a small village,",
    "The three laws of motion are", "List five fruits and their colors:", "How do airplanes fly?",
]
GRAPHS = {"default": None, "gqa": ("lower_ort_attention",)}


def engine_dirs(work: Path, graphs: list[str], max_batch: int, new_tokens: int) -> dict[str, Path]:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
    from engine_builder.util.bundled import smollm2_gguf

    ckpt = work / "ckpt"
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    limits = Limits(max_batch=max_batch, max_input_len=128, max_seq_len=128 + new_tokens)
    dirs = {}
    for graph in graphs:
        out = work / f"engine-{graph}-b{max_batch}-s{limits.max_seq_len}"
        if not out.exists():
            passes = list(DEFAULT_PASSES["onnxruntime"])
            for extra in GRAPHS[graph] or ():
                if extra not in passes:
                    passes.insert(passes.index("eliminate_dead_code"), extra)
            build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                         passes=PassLists(onnxruntime=tuple(passes))))
        dirs[graph] = out
    return dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--graph", nargs="+", default=["default", "gqa"], choices=sorted(GRAPHS))
    parser.add_argument("--work", type=Path, default=Path("build/bench-decode"))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for both (default: physical cores, as the runner uses)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    from engine_builder import LLM, SamplingParams
    from engine_builder.util.bundled import smollm2_gguf
    from engine_builder.util.cpu_cores import physical_cores

    args.work.mkdir(parents=True, exist_ok=True)
    dirs = engine_dirs(args.work, args.graph, max(args.batch), args.new_tokens)
    threads = args.threads or physical_cores()
    torch.set_num_threads(threads)  # the same cores for both
    gguf = smollm2_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                           dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.padding_side = "left"
    from spin_policy import same_spinning

    with same_spinning(threads):  # every engine's session alike (else only the first opened spins), taking turns
        llms = {g: LLM(d, backend="onnxruntime", threads=threads) for g, d in dirs.items()}
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0, ignore_eos=True)

    def ours(llm: LLM, prompts: list[str]) -> tuple[float, float, float]:
        started = time.perf_counter()
        outs = llm.generate(prompts, params)
        seconds = time.perf_counter() - started
        assert all(len(o.token_ids) == args.new_tokens for o in outs)
        t = llm.last_timings
        return len(prompts) * args.new_tokens / seconds, t.decode_tok_s, t.overhead_share

    def reference(prompts: list[str]) -> float:
        enc = tok(prompts, return_tensors="pt", padding=True)
        started = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(**enc, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                              do_sample=False, pad_token_id=tok.pad_token_id)
        seconds = time.perf_counter() - started
        assert out.shape[1] - enc.input_ids.shape[1] == args.new_tokens
        return len(prompts) * args.new_tokens / seconds

    for llm in llms.values():  # warm-up: first-run allocations and lazy init out of the figures
        llm.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, temperature=0))
    reference(PROMPTS[:1])

    samples: dict[str, list] = {}
    for run in range(args.runs):
        for batch in args.batch:
            prompts = (PROMPTS * batch)[:batch]
            for graph, llm in llms.items():
                samples.setdefault(f"{graph}/b{batch}", []).append(ours(llm, prompts))
            samples.setdefault(f"hf/b{batch}", []).append(reference(prompts))
            print(f"run {run + 1}/{args.runs} batch {batch}: " + ", ".join(
                f"{k.split('/')[0]} {v[-1][0] if isinstance(v[-1], tuple) else v[-1]:.1f} tok/s"
                for k, v in samples.items() if k.endswith(f"/b{batch}")), file=sys.stderr, flush=True)

    result: dict[str, dict] = {"threads": {"onnxruntime": threads, "torch": torch.get_num_threads()},
                               "new_tokens": args.new_tokens, "runs": args.runs}
    for batch in args.batch:
        hf_tok_s = statistics.median(samples[f"hf/b{batch}"])
        row: dict = {"hf_tok_s": round(hf_tok_s, 2)}
        for graph in llms:
            runs = samples[f"{graph}/b{batch}"]
            tok_s = statistics.median(r[0] for r in runs)
            row[graph] = {"tok_s": round(tok_s, 2), "ratio_vs_hf": round(tok_s / hf_tok_s, 2),
                          "decode_tok_s": round(statistics.median(r[1] for r in runs), 2),
                          "overhead_share": round(statistics.median(r[2] for r in runs), 4)}
        result[f"batch{batch}"] = row
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for batch in args.batch:
        row = result[f"batch{batch}"]
        for graph in llms:
            r = row[graph]
            print(f"batch {batch} [{graph}]: {r['tok_s']:.1f} tok/s vs HF {row['hf_tok_s']:.1f} tok/s = "
                  f"{r['ratio_vs_hf']:.2f}x; outside execute {100 * r['overhead_share']:.1f}% of decode step time")


if __name__ == "__main__":
    main()
