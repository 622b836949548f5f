"""Soak of `trtbuild serve` under hostile traffic: valid clients beside clients sending oversized, malformed
and abandoned requests, for a fixed time.

    .venv/bin/python benchmarks/serve_soak.py [--minutes 10] [--valid-clients 4] [--hostile-clients 12]
                                              [--baseline-minutes 1] [--stall-seconds 20]
                                              [--hostile-kinds cut,oversized,top_n,malformed,grammar,never_read]
                                              [--per-client-limit N] [--work build/bench-serve] [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (decode.py's engine build, 8 KV slots), one
`trtbuild serve` subprocess on 127.0.0.1. Valid requests are /v1/completions or TGI /generate, short
prompts, 8-32 tokens, greedy. Hostile requests are drawn at random:

    streamed, cut   a streaming request the client closes after its first chunk
    oversized       a 4 MiB body (over the default 1 MiB limit): 413 expected
    huge top_n      top_logprobs 10**6: 400 expected (OpenAI routes answer 400, TGI 422)
    malformed       broken JSON, a non-UTF-8 body, a wrong field type: 400 expected
    grammar         a response_format json_schema: half of them an anyOf of 3,000 objects, past the grammar
                    limits (400 expected, refused before any token), half a small schema (200)
    never_read      a streaming request whose client reads nothing for --stall-seconds, then leaves: the
                    server cancels it after --stalled-stream-timeout (serve's default) and frees its slot

1. baseline: --valid-clients clients send valid requests for --baseline-minutes: their p99 latency.
2. soak: the same valid clients plus --hostile-clients hostile ones, for --minutes.
Each valid client is a user of its own (source address 127.0.0.2, .3, ...); the hostile ones are one
attacker on 127.0.0.1. --per-client-limit N serves with `--max-concurrent-per-client N`, which bounds what
the attacker's connections take (over N in flight: 429 before the body is read).
Reports: responses per kind and status, 5xx count (target 0), the server's RSS growth from after the
baseline to the end (target < 5 %), and the valid requests' p99 in the soak over the baseline's (target
<= 1.5x: what the hostile traffic adds, at the same valid load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "server")]

from decode import engine_dirs  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time", "The three primary colors are", "def fib(n):",
           "A haiku about the sea:", "List three planets:"]
HOSTILE = ("cut", "oversized", "top_n", "malformed", "grammar", "never_read")
SMALL_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name"]}
HUGE_SCHEMA = {"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
                         for i in range(3000)]}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def valid(client, rng: random.Random) -> tuple[int, float]:
    started = time.perf_counter()
    if rng.random() < 0.5:
        r = await client.post("/v1/completions", json={"prompt": rng.choice(PROMPTS), "temperature": 0,
                                                        "max_tokens": rng.randint(8, 32)})
    else:
        r = await client.post("/generate", json={"inputs": rng.choice(PROMPTS),
                                                 "parameters": {"max_new_tokens": rng.randint(8, 32)}})
    return r.status_code, time.perf_counter() - started


async def one(client, rng: random.Random, kind: str, stall_seconds: float = 20.0) -> tuple[str, int, float | None]:
    if kind == "valid":
        status, seconds = await valid(client, rng)
        return kind, status, seconds
    if kind == "cut":
        async with client.stream("POST", "/v1/completions", json={"prompt": rng.choice(PROMPTS), "stream": True,
                                                                   "max_tokens": 64}) as resp:
            async for _ in resp.aiter_lines():
                break  # the client goes away mid-stream
            return kind, resp.status_code, None
    if kind == "oversized":
        r = await client.post("/v1/completions", content=b'{"prompt": "' + b"x" * (4 << 20) + b'"}',
                              headers={"Content-Type": "application/json"})
        return kind, r.status_code, None
    if kind == "grammar":
        schema = HUGE_SCHEMA if rng.random() < 0.5 else SMALL_SCHEMA
        r = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Describe a person as JSON."}], "max_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
        return kind, r.status_code, None
    if kind == "never_read":  # as many tokens as the engine takes after a short prompt (decode.py's: 64)
        async with client.stream("POST", "/v1/completions", json={"prompt": rng.choice(PROMPTS), "stream": True,
                                                                   "max_tokens": 60}) as resp:
            await asyncio.sleep(stall_seconds)  # reads nothing: the server's send stalls, then it cancels
            return kind, resp.status_code, None
    if kind == "top_n":
        r = await client.post("/v1/completions", json={"prompt": "hi", "logprobs": True, "top_logprobs": 10**6})
        return kind, r.status_code, None
    body = rng.choice([b'{"prompt": ', b'{"prompt": "\xff\xfe"}', b'{"prompt": 5, "max_tokens": "many"}'])
    r = await client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    return kind, r.status_code, None


async def soak(url: str, seconds: float, valid_clients: int, hostile_clients: int, seed: int,
               hostile: tuple[str, ...] = HOSTILE, stall_seconds: float = 20.0) -> list[tuple[str, int, float | None]]:
    import httpx

    deadline = time.monotonic() + seconds
    results: list[tuple[str, int, float | None]] = []

    async def client_loop(i: int, kinds: tuple[str, ...], address: str) -> None:
        rng = random.Random(seed + i)
        async with httpx.AsyncClient(base_url=url, timeout=300,
                                     transport=httpx.AsyncHTTPTransport(local_address=address)) as client:
            while time.monotonic() < deadline:
                kind = rng.choice(kinds)
                try:
                    results.append(await one(client, rng, kind, stall_seconds))
                except httpx.TransportError:  # a refused oversized upload may reset the connection
                    results.append((kind, 0, None))

    # each valid client a user of its own, the hostile ones one attacker (Linux routes all of 127/8 to lo)
    await asyncio.gather(*(client_loop(i, ("valid",), f"127.0.0.{2 + i}") for i in range(valid_clients)),
                         *(client_loop(valid_clients + i, hostile, "127.0.0.1") for i in range(hostile_clients)))
    return results


def engine_counters(url: str) -> dict[str, float]:
    """The server's executor counters (/metrics): steps, and how many prefills shared an engine call."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("trtbuild_executor_steps", "trtbuild_batched_prefill_calls", "trtbuild_batched_prefill_requests")
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return {name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if (name := s.name.removesuffix("_total")) in wanted}


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--valid-clients", type=int, default=4)
    parser.add_argument("--hostile-clients", type=int, default=12)
    parser.add_argument("--baseline-minutes", type=float, default=1.0)
    parser.add_argument("--hostile-kinds", default=",".join(HOSTILE),
                        help="which hostile kinds to draw from (comma-separated; default all): separates what the "
                             "refusals cost from what the cut streams, which are real generation up to the cut, cost")
    parser.add_argument("--stall-seconds", type=float, default=20.0,
                        help="how long a never_read client holds its stream unread (serve cancels it after its "
                             "--stalled-stream-timeout)")
    parser.add_argument("--per-client-limit", type=int, default=None,
                        help="serve with --max-concurrent-per-client N (default: no per-client limit)")
    parser.add_argument("--work", type=Path, default=Path("build/bench-serve"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kinds = tuple(args.hostile_kinds.split(","))
    if unknown := set(kinds) - set(HOSTILE):
        parser.error(f"--hostile-kinds: unknown {sorted(unknown)}; choose from {', '.join(HOSTILE)}")
    from live_server import LiveServer

    args.work.mkdir(parents=True, exist_ok=True)
    engine = engine_dirs(args.work, ["default"], 8, 64)["default"]
    limit = () if args.per_client_limit is None else ("--max-concurrent-per-client", str(args.per_client_limit))
    server = LiveServer(engine, *limit)
    try:
        baseline = asyncio.run(soak(server.url, args.baseline_minutes * 60, args.valid_clients, 0, seed=1))
        rss_start = rss_bytes(server.proc.pid)
        results = asyncio.run(soak(server.url, args.minutes * 60, args.valid_clients, args.hostile_clients, seed=1,
                                   hostile=kinds, stall_seconds=args.stall_seconds))
        rss_end = rss_bytes(server.proc.pid)
        counters = engine_counters(server.url)
    finally:
        code = server.stop()
    statuses = Counter(f"{kind} {status}" for kind, status, _ in results)
    def latencies(rows: list[tuple[str, int, float | None]]) -> list[float]:
        return [s for kind, status, s in rows if kind == "valid" and status == 200 and s is not None]

    idle, loaded = latencies(baseline), latencies(results)
    result = {
        "minutes": args.minutes, "hostile_kinds": list(kinds), "valid_clients": args.valid_clients,
        "hostile_clients": args.hostile_clients, "per_client_limit": args.per_client_limit,
        "requests": len(results), "baseline_requests": len(baseline),
        "responses": dict(sorted(statuses.items())),
        "http_5xx": sum(n for key, n in statuses.items() if key.split()[1].startswith("5")),
        "rss_start_mb": round(rss_start / 1e6, 1), "rss_end_mb": round(rss_end / 1e6, 1),
        "rss_growth": round(rss_end / rss_start - 1, 4),
        "baseline_p99_s": round(p99(idle), 3), "soak_p99_s": round(p99(loaded), 3),
        "p99_ratio": round(p99(loaded) / p99(idle), 2), "server_exit_code": code,
        "engine_counters": counters,  # since the server started (baseline included)
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['requests']} requests in {args.minutes} min from {args.valid_clients} valid + "
              f"{args.hostile_clients} hostile clients (per-client limit {args.per_client_limit}): "
              f"{result['http_5xx']} 5xx; RSS {result['rss_start_mb']} -> "
              f"{result['rss_end_mb']} MB ({result['rss_growth']:+.1%}); valid p99 {result['soak_p99_s']} s vs "
              f"{result['baseline_p99_s']} s without the hostile clients ({result['p99_ratio']}x); "
              f"responses {result['responses']}; engine {counters}")


if __name__ == "__main__":
    main()
