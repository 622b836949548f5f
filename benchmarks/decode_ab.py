"""Decode of one engine by two checkouts of trtbuild, side by side: a change's before and after.

    python benchmarks/decode_ab.py ENGINE --before /path/to/main --after . [--runs 10] [--tokens 64] [--threads 2]
                                          [--batch 1]

Each checkout opens the engine in a worker process of its own (benchmarks/peers_systems.Ours: the onnxruntime
twin, no prefix cache) and warms up; then the two take turns (ABBA order), each run decoding TOKENS tokens
after the same 32-token prompt (--batch copies of it, decoded together). Prints per side the median decode tok/s
(batch * (n - 1) / (t_n - t_1)), every run,
and the median process CPU milliseconds per token (user + system: less disturbed by other processes than
wall time on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, os, sys
from pathlib import Path
root, engine, threads, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root)
sys.path.insert(1, os.path.join(root, "benchmarks"))
import peers_systems
system = peers_systems.Ours(Path(engine), threads)
prompts = [list(range(100, 132))] * batch
system.generate(prompts, 8)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    before = os.times()
    times = system.generate(prompts, n)
    after = os.times()
    cpu = after.user + after.system - before.user - before.system
    print(json.dumps({"tok_s": batch * (n - 1) / (times[-1] - times[0]), "cpu_ms": 1000 * cpu / n}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--before", type=Path, required=True, help="a trtbuild checkout (its repository root)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together (the engine's max_batch at most)")
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    workers = {}
    for side, root in sides.items():
        workers[side] = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(args.engine), str(args.threads), str(args.batch)], text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})
        if workers[side].stdout.readline().strip() != "ready":
            raise SystemExit(f"the {side} worker ({root}) did not open {args.engine}")
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for i in range(args.runs):
        for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
            workers[side].stdin.write(f"{args.tokens}\n")
            workers[side].stdin.flush()
            runs[side].append(json.loads(workers[side].stdout.readline()))
    for side, worker in workers.items():
        worker.stdin.close()
        worker.wait()
        r = runs[side]
        print(f"{side} ({sides[side]}) batch {args.batch}: decode {statistics.median(x['tok_s'] for x in r):.1f} tok/s median, runs "
              f"{[round(x['tok_s'], 1) for x in r]}; CPU {statistics.median(x['cpu_ms'] for x in r):.2f} ms/token")


if __name__ == "__main__":
    main()
