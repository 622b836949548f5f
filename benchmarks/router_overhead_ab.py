"""Router overhead, two versions of the router side by side: each `trtbuild route` (one per source tree) over the
same `trtbuild serve` replica, requests sent one at a time in turn (direct, A, B; order alternating), so machine
load hits all three alike. Prints p50 latency of each, each router's overhead (p50 routed - p50 direct) and its
CPU time per request (/proc, over all requests).

    .venv/bin/python benchmarks/router_overhead_ab.py --engine ENGINE_DIR --baseline /path/to/other/checkout \\
        [--candidate .] [--requests 1500] [--path /v1/models | /v1/completions]

Each router runs with its tree as working dir and PYTHONPATH, so `python -m engine_builder.cli` imports that
tree's code; the replica runs this tree's. --path /v1/completions sends a 1-token greedy completion.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "router"), str(ROOT / "tests" / "server")]

import httpx  # noqa: E402
from route_processes import Replica  # noqa: E402

HEALTH_INTERVAL_S = 30.0  # health checks far apart: their CPU would count against the requests


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_router(tree: Path, backend: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "route", "--backend", backend, "--port", "0",
                             "--health-interval", str(HEALTH_INTERVAL_S)], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    while line := proc.stdout.readline():
        if line.startswith("routing at "):
            return proc, line.split()[-1]
    raise SystemExit(f"trtbuild route from {tree} did not start (exit {proc.wait()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, required=True, help="Source tree of router A.")
    parser.add_argument("--candidate", type=Path, default=ROOT, help="Source tree of router B (default: this one).")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--path", default="/v1/models", choices=["/v1/models", "/v1/completions"])
    args = parser.parse_args()
    replica = Replica(args.engine)
    routers = {}
    try:
        for name, tree in (("baseline", args.baseline), ("candidate", args.candidate)):
            routers[name] = start_router(tree.resolve(), replica.url)
        urls = {"direct": replica.url, **{name: url for name, (_, url) in routers.items()}}
        times: dict[str, list[float]] = {name: [] for name in urls}
        body = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
        with httpx.Client(timeout=120) as client:
            def send(url: str) -> httpx.Response:
                if args.path == "/v1/models":
                    return client.get(url + args.path)
                return client.post(url + args.path, json=body)

            for _ in range(50):  # warm-up
                for url in urls.values():
                    send(url)
            cpu0 = {name: cpu_seconds(proc.pid) for name, (proc, _) in routers.items()}
            for i in range(args.requests):
                for name, url in (list(urls.items()) if i % 2 else list(urls.items())[::-1]):
                    t = time.perf_counter()
                    r = send(url)
                    times[name].append(time.perf_counter() - t)
                    assert r.status_code == 200, r.text
            cpu1 = {name: cpu_seconds(proc.pid) for name, (proc, _) in routers.items()}
        p50 = {name: statistics.median(v) * 1000 for name, v in times.items()}
        load = Path("/proc/loadavg").read_text().split()[0]
        print(f"{args.path}, {args.requests} requests each, load average {load}: direct p50 {p50['direct']:.2f} ms")
        for name in routers:
            print(f"  {name}: p50 {p50[name]:.2f} ms, overhead {p50[name] - p50['direct']:.2f} ms, router CPU "
                  f"{(cpu1[name] - cpu0[name]) / args.requests * 1000:.2f} ms per request")
    finally:
        for proc, _ in routers.values():
            proc.terminate()
            proc.wait()
        replica.stop()


if __name__ == "__main__":
    main()
