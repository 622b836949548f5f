"""One contender of benchmarks/peers.py in a process of its own: load, warm up, then answer commands.

    python benchmarks/peers_worker.py KIND PATH --threads T --context C

stdin takes one JSON command per line, stdout answers one JSON line each:
  {"op": "generate", "prompts": [[ids]], "n": N}   -> {"times": [t_1 .. t_N]} (perf_counter seconds)
  {"op": "prefill", "prompt": [ids]}               -> {"seconds": s}
  {"op": "log_probs", "windows": [[ids]], "out": F} -> {"positions": p} (np.save(F, [positions, vocab]))
  {"op": "rss"}                                    -> {"peak_rss_bytes": VmHWM, "pid": pid}
Its first line, once loaded and warmed: {"ready": true, "pid": pid, "spinning": "on" | "off" | "-" (whether its
onnxruntime threads spin-wait; "-" for a system not on onnxruntime), "load_average": the 1-minute load average
just before it opened (what our `auto` spinning rule read, runner/ort_spinning.py)}.
Anything a library prints goes to stderr: the answers own file descriptor 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # after the repo root: benchmarks/passes.py would shadow passes/

import peers_systems  # noqa: E402


def open_system(kind: str, path: Path, threads: int, context: int, logits_all: bool):
    if kind == "ours":
        return peers_systems.Ours(path, threads)
    if kind == "genai":
        return peers_systems.OrtGenAI(path, threads)
    if kind == "llama.cpp":
        return peers_systems.LlamaCpp(path, threads, context, logits_all)
    if kind == "transformers":
        return peers_systems.Transformers(path, threads)
    raise SystemExit(f"unknown system kind {kind}")


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("path", type=Path)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--logits-all", action="store_true", help="llama.cpp: keep every position's logits")
    parser.add_argument("--warmup", default="", help="JSON: {prompt: ids, n: tokens} run once before answering")
    args = parser.parse_args()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # C libraries' prints go to stderr
    load_average = os.getloadavg()[0]
    system = open_system(args.kind, args.path, args.threads, args.context, args.logits_all)
    if args.warmup:
        w = json.loads(args.warmup)
        system.generate([w["prompt"]], w["n"])
    spinning = system.spinning() if hasattr(system, "spinning") else "-"
    answers.write(json.dumps({"ready": True, "pid": os.getpid(), "spinning": spinning,
                              "load_average": load_average}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "generate":
            answer = {"times": system.generate(cmd["prompts"], cmd["n"])}
        elif op == "prefill":
            answer = {"seconds": system.prefill(cmd["prompt"])}
        elif op == "log_probs":
            lp = system.log_probs([np.asarray(w, np.int64) for w in cmd["windows"]])
            np.save(cmd["out"], lp.astype(np.float32))
            answer = {"positions": len(lp)}
        elif op == "rss":
            answer = {"peak_rss_bytes": peak_rss(), "pid": os.getpid()}
        elif op == "quit":
            break
        else:
            answer = {"error": f"unknown op {op}"}
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
