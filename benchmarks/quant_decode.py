"""Decode speed and size per quantization scheme, against llama.cpp on the same model's GGUF.

    .venv/bin/python benchmarks/quant_decode.py [--runs 3] [--new-tokens 128] [--schemes fp32 int8_wo int4_awq ...]
                                                [--threads N] [--work build/bench-quant] [--json]

SmolLM2-135M-Instruct from the bundled GGUF (Q4_1). Each variant (benchmarks/smollm2_quant.py: the
scheme and its group size, lm_head kept float as in tests/eval/test_quantized_fidelity.py) is
converted (`convert --quant`) and built as an onnxruntime engine; decode tok/s at batch 1 is
generated tokens / wall time of one greedy generate call of --new-tokens tokens (prefill included,
EOS ignored). llama.cpp (`llama-cpp-python`, installed by `make bench-install`) runs the bundled
Q4_1 GGUF itself with the same prompt, the same thread count and the same number of tokens,
sampled greedily. Each run alternates the contenders so load from elsewhere hits all alike; figures
are medians over --runs.

Also printed: each scheme's checkpoint size (rank0.safetensors) and engine-dir size, counting
only files the engine dir holds itself (the checkpoint's weights are hard-linked, not copied).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from smollm2_quant import VARIANTS, checkpoint, import_llama_cpp  # noqa: E402

PROMPT = "The capital of France is"


def engine_dir(work: Path, variant: str, new_tokens: int) -> tuple[Path, Path]:
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    ckpt, out = checkpoint(work, variant), work / f"engine-{variant}-s{64 + new_tokens}"
    if not out.exists():
        limits = Limits(max_batch=1, max_input_len=64, max_seq_len=64 + new_tokens)
        build(ckpt, out, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits))
    return ckpt, out


def own_bytes(path: Path) -> int:
    """Bytes of the files under `path` with one link (hard links to the checkpoint are not counted)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.stat().st_nlink == 1)


def ours(llm, new_tokens: int) -> float:
    from engine_builder import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    out = llm.generate([PROMPT], params)[0]
    assert len(out.token_ids) == new_tokens, len(out.token_ids)
    return new_tokens / (time.perf_counter() - started)


def llama_cpp(model, new_tokens: int) -> float:
    tokens = model.tokenize(PROMPT.encode(), add_bos=False)
    model.reset()
    started = time.perf_counter()
    n = 0
    for _ in model.generate(tokens, temp=0.0, top_k=1, reset=True):  # never stops on EOS by itself
        n += 1
        if n == new_tokens:
            break
    return new_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--schemes", nargs="+", default=["fp32", "int8_wo", "int4_awq"], choices=sorted(VARIANTS))
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for all (default: physical cores)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-quant"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    Llama = import_llama_cpp().Llama
    from engine_builder import LLM
    from engine_builder.util.bundled import smollm2_gguf
    from engine_builder.util.cpu_cores import physical_cores

    threads = args.threads or physical_cores()
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = {s: engine_dir(args.work, s, args.new_tokens) for s in args.schemes}
    llms = {s: LLM(dirs[s][1], backend="onnxruntime", threads=threads) for s in args.schemes}
    gguf = smollm2_gguf()
    reference = Llama(model_path=str(gguf), n_ctx=64 + args.new_tokens, n_threads=threads, verbose=False)
    for s in args.schemes:  # warm-up: first-call allocations stay out of the figures
        ours(llms[s], 8)
    llama_cpp(reference, 8)

    speeds: dict[str, list[float]] = {s: [] for s in [*args.schemes, "llama.cpp"]}
    for _ in range(args.runs):
        for s in args.schemes:
            speeds[s].append(ours(llms[s], args.new_tokens))
        speeds["llama.cpp"].append(llama_cpp(reference, args.new_tokens))
    median = {s: statistics.median(v) for s, v in speeds.items()}
    base = median["llama.cpp"]
    rows = {s: {"tok_s": round(median[s], 1), "vs_llama_cpp": round(median[s] / base, 3),
                "checkpoint_mb": round((dirs[s][0] / "rank0.safetensors").stat().st_size / 1e6, 1),
                "engine_dir_own_mb": round(own_bytes(dirs[s][1]) / 1e6, 1)} for s in args.schemes}
    rows["llama.cpp"] = {"tok_s": round(base, 1), "vs_llama_cpp": 1.0,
                         "checkpoint_mb": round(gguf.stat().st_size / 1e6, 1), "engine_dir_own_mb": None}
    if args.json:
        print(json.dumps({"threads": threads, "new_tokens": args.new_tokens, "runs": args.runs, "results": rows}))
        return
    print(f"SmolLM2-135M decode, batch 1, {args.new_tokens} tokens, {threads} threads, median of {args.runs}")
    print(f"{'':<13} {'tok/s':>8} {'vs llama.cpp':>13} {'ckpt MB':>9} {'engine MB':>10}")
    for s, r in rows.items():
        engine_mb = "-" if r["engine_dir_own_mb"] is None else f"{r['engine_dir_own_mb']:.1f}"
        print(f"{s:<13} {r['tok_s']:>8.1f} {r['vs_llama_cpp']:>12.2f}x {r['checkpoint_mb']:>9.1f} {engine_mb:>10}")


if __name__ == "__main__":
    main()
