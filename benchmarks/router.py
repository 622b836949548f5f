"""`trtbuild route` in front of two `trtbuild serve --prefix-cache` replicas: its overhead, failover and prefix hits.

    .venv/bin/python benchmarks/router.py [--requests 200] [--groups 24] [--per-group 4]
                                          [--work build/bench-router] [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (4 KV slots, prompts up to 256 tokens), two replicas and
the router as subprocesses on 127.0.0.1 (this script starts and stops them).

1. overhead: the same request sent alternately straight to replica 1 and through a router over replica 1
   alone (so both reach the same process), one at a time, --requests of each: p50 latency of each and
   their difference, and the router process's CPU time per request (/proc: what it costs, however loaded
   the machine is). Twice: a 1-token greedy /v1/completions (what a user sees) and GET /v1/models (the
   proxy path alone, no model work). Target (issue 21): <= 2 ms p50.
2. prefix: a shared-system-prompt workload, --groups system prompts (~180 tokens each, taken from the
   shipped public-domain text) x --per-group user questions, shuffled, 4 at a time, 1 new token each, once
   through a round-robin router and once through a prefix-aware one (fresh system prompts each time,
   so neither run inherits the other's cache). Prefix-cache hit rate = prompt tokens copied from a
   replica's cache / prompt tokens looked up, summed over both replicas (their /metrics). Target: the
   prefix-aware rate above round-robin's.
3. failover: --requests non-streamed greedy /v1/completions, 16 at a time, through a round-robin router;
   replica 2 is SIGKILLed after a quarter of them are answered. Lost = any request not answered 200 with
   text. Target: 0 lost. Then the replica is restarted and the seconds until the router puts it back
   are reported.

A final line of JSON holds the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "router"), str(ROOT / "tests" / "server")]

import httpx  # noqa: E402
from live_server import metrics  # noqa: E402
from route_processes import Replica, Router  # noqa: E402  (replicas on fixed ports, the router process)

REPLICA_FLAGS = ("--prefix-cache",)


def build_engine(work: Path) -> Path:
    from converters.convert import convert
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits
    from engine_builder.util.bundled import smollm2_gguf

    work.mkdir(parents=True, exist_ok=True)
    ckpt, engine = work / "ckpt", work / "engine-b4-s272"
    if not ckpt.exists():
        convert(smollm2_gguf(), ckpt, dtype="float32")
    if not engine.exists():
        build(ckpt, engine, BuildConfig(targets=("onnxruntime",), dtype="float32",
                                        limits=Limits(max_batch=4, max_input_len=256, max_seq_len=272)))
    return engine


def p50_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process PID so far (/proc/PID/stat utime, stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overhead(direct: str, routed: str, n: int, router_pid: int) -> dict:
    body = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}
    out = {}
    with httpx.Client(timeout=120) as c:
        for name, send in (("completion", lambda url: c.post(f"{url}/v1/completions", json=body)),
                           ("models", lambda url: c.get(f"{url}/v1/models"))):
            times = {direct: [], routed: []}
            cpu = 0.0
            for i in range(n + 10):  # alternate, so load drifts on the machine hit both alike; 10 warm-up pairs
                for url in (direct, routed) if i % 2 else (routed, direct):
                    c0 = cpu_seconds(router_pid) if url == routed else 0.0
                    t = time.perf_counter()
                    r = send(url)
                    elapsed = time.perf_counter() - t
                    if url == routed and i >= 10:
                        cpu += cpu_seconds(router_pid) - c0
                    assert r.status_code == 200, r.text
                    if i >= 10:
                        times[url].append(elapsed)
            out[name] = {"direct_p50_ms": p50_ms(times[direct]), "router_p50_ms": p50_ms(times[routed]),
                         "overhead_p50_ms": p50_ms(times[routed]) - p50_ms(times[direct]),
                         "router_cpu_ms_per_request": cpu / n * 1000}
    return out


def system_prompts(count: int, seed: int) -> list[str]:
    from engine_builder.util.text_files import builtin_text

    words = builtin_text("eval.txt").text.split()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        start = rng.randrange(len(words) - 120)
        out.append("You answer questions about this passage. " + " ".join(words[start:start + 70]))
    return out


def hit_tokens(replicas: list[Replica]) -> tuple[float, float]:
    ms = [metrics(r.url) for r in replicas]
    return (sum(m["trtbuild_prefix_cache_hit_tokens_total"] for m in ms),
            sum(m["trtbuild_prefix_cache_lookup_tokens_total"] for m in ms))


def prefix_hit_rate(replicas: list[Replica], policy: str, groups: int, per_group: int, seed: int) -> dict:
    router = Router([r.url for r in replicas], policy)
    try:
        work = [(s, q) for s in system_prompts(groups, seed) for q in range(per_group)]
        random.Random(seed).shuffle(work)
        hits0, lookups0 = hit_tokens(replicas)

        def one(item: tuple[str, int]) -> None:
            system, q = item
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": f"Question {q}: what does the passage say about the {q}th word?"}]
            r = httpx.post(f"{router.url}/v1/chat/completions", timeout=600,
                           json={"messages": messages, "max_tokens": 1, "temperature": 0})
            assert r.status_code == 200, r.text

        t = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(one, work))
        seconds = time.perf_counter() - t
        hits1, lookups1 = hit_tokens(replicas)
        per_backend = {r.url: router.backend_metric("requests_total", r.url) for r in replicas}
    finally:
        router.stop()
    return {"hit_rate": (hits1 - hits0) / (lookups1 - lookups0), "requests": len(work), "seconds": seconds,
            "requests_per_backend": per_backend}


def failover(replicas: list[Replica], n: int) -> dict:
    router = Router([r.url for r in replicas], "round-robin")
    victim, answered, lost = replicas[1], [], []
    killed_at = threading.Event()
    try:
        def one(i: int) -> None:
            body = {"prompt": f"Tell me fact number {i} about the sea:", "max_tokens": 8, "temperature": 0}
            try:
                r = httpx.post(f"{router.url}/v1/completions", json=body, timeout=600)
                ok = r.status_code == 200 and r.json()["choices"][0]["text"] is not None
            except httpx.HTTPError as exc:
                ok, r = False, exc
            (answered if ok else lost).append(i if ok else f"{i}: {r}")
            if len(answered) == n // 4 and not killed_at.is_set():
                killed_at.set()
                victim.kill()

        t = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(n)))
        seconds = time.perf_counter() - t
        m = router.metrics()
        victim.restart()
        t_back = time.perf_counter()
        router.wait_healthy(victim.url)
        back = time.perf_counter() - t_back
    finally:
        router.stop()
    return {"requests": n, "lost": len(lost), "lost_examples": lost[:3], "killed": killed_at.is_set(),
            "seconds": seconds, "retries": m["trtbuild_router_retries_total"],
            "victim_errors": m[f'trtbuild_router_backend_errors_total{{backend="{victim.url}"}}'],
            "put_back_after_restart_s": back}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--per-group", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("build/bench-router"))
    parser.add_argument("--engine", type=Path, help="Serve this engine dir instead of building SmolLM2's (the "
                        "prefix phase needs a real tokenizer and chat template).")
    parser.add_argument("--phases", nargs="+", default=["overhead", "prefix", "failover"],
                        choices=["overhead", "prefix", "failover"])
    parser.add_argument("--json", action="store_true", help="Only the final JSON line.")
    args = parser.parse_args()
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, flush=True))

    engine = args.engine or build_engine(args.work)
    with ThreadPoolExecutor(2) as pool:
        replicas = list(pool.map(lambda _: Replica(engine, *REPLICA_FLAGS), range(2)))
    out = {}
    try:
        if "overhead" in args.phases:
            # health checks 5 s apart: their CPU would count against each request otherwise
            router = Router([replicas[0].url], "round-robin", health_interval=5.0)
            try:
                out["overhead"] = overhead(replicas[0].url, router.url, args.requests, router.proc.pid)
            finally:
                router.stop()
            for name, o in out["overhead"].items():
                say(f"overhead ({name}): direct p50 {o['direct_p50_ms']:.2f} ms, via router "
                    f"{o['router_p50_ms']:.2f} ms, overhead {o['overhead_p50_ms']:.2f} ms (target <= 2 ms); router CPU "
                    f"{o['router_cpu_ms_per_request']:.2f} ms per request")
        if "prefix" in args.phases:
            out["prefix"] = {policy: prefix_hit_rate(replicas, policy, args.groups, args.per_group, seed)
                             for seed, policy in enumerate(("round-robin", "prefix-aware"))}
            for policy, p in out["prefix"].items():
                say(f"prefix-cache hit rate, {policy}: {p['hit_rate']:.3f} ({p['requests']} requests in "
                    f"{p['seconds']:.1f} s; per replica {list(p['requests_per_backend'].values())})")
        if "failover" in args.phases:
            out["failover"] = fail = failover(replicas, args.requests)
            say(f"failover: {fail['lost']} lost of {fail['requests']} with one of two replicas SIGKILLed mid-load "
                f"({fail['retries']:.0f} retried, {fail['seconds']:.1f} s); restarted replica put back after "
                f"{fail['put_back_after_restart_s']:.2f} s")
    finally:
        for r in replicas:
            r.stop()
    print(json.dumps(out))
    fail = out.get("failover")
    sys.exit(1 if fail and (fail["lost"] or not fail["killed"]) else 0)

if __name__ == "__main__":
    main()
