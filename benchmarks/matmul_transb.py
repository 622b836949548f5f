"""lower_ort_matmul_transb on SmolLM2-135M float32: session creation, RSS at load and decode speed, with and without.

    python benchmarks/matmul_transb.py [--runs 5] [--new-tokens 64] [--work build/bench-transb]

Two engine dirs from one checkpoint, the default onnxruntime pass list and the same list without
lower_ort_matmul_transb (the Transpose(W) -> MatMul form onnxruntime constant-folds into a transposed copy).
Each run loads each graph in a fresh process (session creation seconds, peak and anonymous RSS after it), then
times LLM.generate of --new-tokens greedy tokens at batch 1 and batch 8 (EOS ignored). Runs alternate the two
graphs so load from elsewhere on a shared machine hits both alike; medians over --runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBE = """
import json, sys, time
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import load_session
engine = EngineDir.load(sys.argv[1], verify=False)
started = time.perf_counter()
session = load_session(engine)
seconds = time.perf_counter() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
mb = {k: int(status[k].split()[0]) // 1024 for k in ("VmHWM", "RssAnon")}
del session
from engine_builder import LLM, SamplingParams
llm = LLM(sys.argv[1], backend="onnxruntime", verify=False, prefix_cache=False)
params = SamplingParams(max_new_tokens=int(sys.argv[2]), temperature=0, ignore_eos=True)
rates = {}
for batch in (1, 8):
    prompts = ["The capital of France is", "Write a short poem about the sea."] * 4
    llm.generate(prompts[:batch], SamplingParams(max_new_tokens=2, temperature=0))  # warm
    started = time.perf_counter()
    outs = llm.generate(prompts[:batch], params)
    rates[batch] = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started)
print(json.dumps({"session_s": seconds, **mb, "tok_s": rates, "text": outs[0].text[:40]}))
"""


def engines(work: Path) -> dict[str, Path]:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import DEFAULT_PASSES, BuildConfig, Limits, PassLists
    from engine_builder.util.bundled import smollm2_gguf

    limits = Limits(max_batch=8, max_input_len=128, max_seq_len=256)
    without = tuple(p for p in DEFAULT_PASSES["onnxruntime"] if p != "lower_ort_matmul_transb")
    out = {"FusedMatMul(transB)": work / "engine-transb", "Transpose->MatMul": work / "engine-transpose"}
    if not (work / "ckpt").exists():
        convert(smollm2_gguf(), work / "ckpt", dtype="float32")
    for (_, path), passes in zip(out.items(), (DEFAULT_PASSES["onnxruntime"], without)):
        if not path.exists():
            build(work / "ckpt", path, BuildConfig(targets=("onnxruntime",), dtype="float32", limits=limits,
                                                   passes=PassLists(onnxruntime=passes)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("build/bench-transb"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    dirs = engines(args.work)
    results: dict[str, list[dict]] = {name: [] for name in dirs}
    for _ in range(args.runs):
        for name, path in dirs.items():
            proc = subprocess.run([sys.executable, "-c", PROBE, str(path), str(args.new_tokens)],
                                  capture_output=True, text=True, check=True)
            results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in ("session_s", "VmHWM", "RssAnon")}
        tok = {b: statistics.median(r["tok_s"][b] for r in runs) for b in ("1", "8")}
        print(f"{name:20s} session {med['session_s']:.2f} s, peak RSS {med['VmHWM']:.0f} MB, "
              f"anon {med['RssAnon']:.0f} MB, decode {tok['1']:.1f} tok/s (batch 1), {tok['8']:.1f} tok/s (batch 8); "
              f"{runs[0]['text']!r}")


if __name__ == "__main__":
    main()
