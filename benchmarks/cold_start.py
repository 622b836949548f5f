"""Cold start: seconds from the command to the first generated token on SmolLM2-135M, ours beside llama.cpp's.

    python benchmarks/cold_start.py [--runs 5] [--work build/bench-cold]

Ours: `trtbuild run ENGINE --prompt ... --max-new-tokens 1` as a fresh process (the onnxruntime float32
twin; the engine dir is built once into --work), timed to the first byte on its stdout. llama.cpp:
a fresh `python -c` that loads the bundled Q4_1 GGUF with llama-cpp-python and generates one token.
Medians of --runs alternating runs after one untimed run of each (warm page cache and __pycache__, as on
a user's machine), printed with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "The capital of France is"
LLAMA_CPP = ("import sys; from llama_cpp import Llama; m = Llama(model_path=sys.argv[1], n_ctx=256, verbose=False); "
             "print(next(iter(m.create_completion(sys.argv[2], max_tokens=1, stream=True)))['choices'][0]['text'], "
             "flush=True)")


# Python's default: bytecode cached in __pycache__ (pip compiles installed packages; PYTHONDONTWRITEBYTECODE, set
# in some dev shells, would recompile every module of ours on each start)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def first_output_seconds(cmd: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV)
    assert proc.stdout is not None
    proc.stdout.read(1)  # the first byte of generated text
    elapsed = time.perf_counter() - started
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return elapsed


def engine(work: Path) -> Path:
    out = work / "engine-fp32"
    if not out.exists():
        from converters.convert import convert
        from engine_builder.build.pipeline import build
        from engine_builder.formats.build_config import BuildConfig, Limits
        from engine_builder.util.bundled import smollm2_gguf

        if not (work / "ckpt-fp32").exists():
            convert(smollm2_gguf(), work / "ckpt-fp32", dtype="float32")
        build(work / "ckpt-fp32", out, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                                   limits=Limits(max_batch=1, max_input_len=128, max_seq_len=256)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("build/bench-cold"))
    args = parser.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("llama-cpp-python is not installed; run `make bench-install` first") from None
    from engine_builder.util.bundled import smollm2_gguf

    args.work.mkdir(parents=True, exist_ok=True)
    ours_cmd = [sys.executable, "-m", "engine_builder.cli", "run", str(engine(args.work)), "--prompt", PROMPT,
                "--max-new-tokens", "1"]
    theirs_cmd = [sys.executable, "-c", LLAMA_CPP, str(smollm2_gguf()), PROMPT]
    ours, theirs = [], []
    first_output_seconds(ours_cmd), first_output_seconds(theirs_cmd)  # untimed: page cache and bytecode warm
    load = os.getloadavg()[0]  # other processes on the cores stretch both figures: printed beside them
    for _ in range(args.runs):
        ours.append(first_output_seconds(ours_cmd))
        theirs.append(first_output_seconds(theirs_cmd))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"first token after the command, SmolLM2-135M, median of {args.runs}: trtbuild run {o:.2f} s, "
          f"llama.cpp (llama-cpp-python) {t:.2f} s, ratio {o / t:.2f}x; load average {load:.2f} -> "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
