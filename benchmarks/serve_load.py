"""Load test of `trtbuild serve`: concurrent streaming clients against a live server on 127.0.0.1.

    .venv/bin/python benchmarks/serve_load.py [--clients 64] [--requests 4] [--max-tokens 8 64]
                                              [--threads N] [--timeout 1800] [--work build/bench-serve] [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (an engine with 8 KV slots, built like decode.py's),
served by a `trtbuild serve` subprocess this script starts and stops (127.0.0.1, --port 0).

1. load: --clients concurrent clients each send --requests streaming /v1/completions requests (random
   prompt lengths and max_tokens, temperature 0.8, a fixed seed each; the whole run is seeded, so it
   is the same every time). Reports requests/s and generated tokens/s over the phase's wall time,
   and p50/p99 time to first token and inter-token latency as the clients see them.
2. check: the same requests again, not streamed, as many at once: each stream's concatenated text
   must equal its non-streamed text (no token lost or duplicated, batch-invariant seeded sampling),
   and no request may fail. Exit 1 otherwise.
3. batching: one set of greedy requests run sequentially (1 client), then by 8 clients at once on the
   same server: generated tokens/s of each and their ratio (in-flight batching's gain; the issue asks
   for >= 3x).

A final line of JSON holds the figures. Every loop is bounded in count, and each phase by --timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "server")]

from decode import engine_dirs  # noqa: E402  (the same SmolLM2 engine build as the decode benchmark)

WORDS = ("once upon a time in a small village by the sea there lived an old fisherman who told stories about "
         "the stars the winds and the ships that sailed beyond the edge of the world every evening the children "
         "gathered around his fire to listen").split()
BATCHING_CONCURRENCY = 8
BATCHING_REQUESTS = 16
BATCHING_MAX_TOKENS = 48


@dataclass
class Result:
    text: str = ""
    tokens: int = 0
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    error: str | None = None


def make_requests(rng: random.Random, count: int, max_tokens: tuple[int, int]) -> list[dict]:
    out = []
    for _ in range(count):
        start = rng.randrange(len(WORDS))
        prompt = " ".join((WORDS[start:] + WORDS)[:rng.randint(2, 60)])
        out.append({"prompt": prompt, "max_tokens": rng.randint(*max_tokens), "temperature": 0.8,
                    "seed": rng.randrange(2**31)})
    return out


async def stream_one(client, body: dict) -> Result:
    r, sent = Result(), time.perf_counter()
    last = sent
    try:
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    r.error = chunk["error"]["message"]
                    return r
                now = time.perf_counter()  # one chunk per generated token
                if r.ttft is None:
                    r.ttft = now - sent
                else:
                    r.gaps.append(now - last)
                last = now
                r.text += chunk["choices"][0]["text"]
                r.tokens += 1
    except Exception as exc:  # noqa: BLE001  (counted and reported: the run must show 0 errors)
        r.error = f"{type(exc).__name__}: {exc}"
    return r


async def whole_one(client, body: dict) -> Result:
    try:
        resp = await client.post("/v1/completions", json=body)
    except Exception as exc:  # noqa: BLE001
        return Result(error=f"{type(exc).__name__}: {exc}")
    if resp.status_code != 200:
        return Result(error=f"HTTP {resp.status_code}: {resp.text[:200]}")
    data = resp.json()
    return Result(text=data["choices"][0]["text"], tokens=data["usage"]["completion_tokens"])


async def run_clients(url: str, per_client: list[list[dict]], call, timeout: float) -> tuple[list[Result], float]:
    """Each client sends its requests one after another; all clients at once. Results in request order."""
    import httpx

    limits = httpx.Limits(max_connections=len(per_client) + 1, max_keepalive_connections=len(per_client) + 1)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        async def one_client(bodies: list[dict]) -> list[Result]:
            return [await call(client, b) for b in bodies]

        started = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(one_client(b) for b in per_client)), timeout)
        return [r for rs in results for r in rs], time.perf_counter() - started


def percentile(values: list[float], q: float) -> float | None:
    import numpy as np

    return round(float(np.percentile(values, q)), 4) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4, help="requests per client")
    parser.add_argument("--max-tokens", type=int, nargs=2, default=[8, 64], metavar=("LO", "HI"))
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime threads of the server")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per phase at most")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench-serve")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()

    from live_server import LiveServer, wait_idle

    def say(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    engine = engine_dirs(args.work, ["default"], BATCHING_CONCURRENCY, max(args.max_tokens[1], BATCHING_MAX_TOKENS))
    engine = engine["default"]
    rng = random.Random(0)
    load = [make_requests(rng, args.requests, tuple(args.max_tokens)) for _ in range(args.clients)]
    batching = [{**b, "temperature": 0, "max_tokens": BATCHING_MAX_TOKENS}
                for b in make_requests(rng, BATCHING_REQUESTS, (1, 1))]
    server_args = ["--max-concurrent-requests", str(max(args.clients, 128))]
    if args.threads:
        server_args += ["--threads", str(args.threads)]
    server = LiveServer(engine, *server_args)
    try:
        say(f"server {server.url}; phase 1: {args.clients} streaming clients x {args.requests} requests")
        streamed, wall = asyncio.run(run_clients(server.url, load, stream_one, args.timeout))
        say(f"phase 2: the same {len(streamed)} requests, not streamed")
        whole, _ = asyncio.run(run_clients(server.url, load, whole_one, args.timeout))
        wait_idle(server.url)
        say(f"phase 3: {BATCHING_REQUESTS} greedy requests, sequential then {BATCHING_CONCURRENCY} at once")
        seq, seq_wall = asyncio.run(run_clients(server.url, [batching], stream_one, args.timeout))
        lanes = [batching[i::BATCHING_CONCURRENCY] for i in range(BATCHING_CONCURRENCY)]
        conc, conc_wall = asyncio.run(run_clients(server.url, lanes, stream_one, args.timeout))
    finally:
        code = server.stop()

    errors = [r.error for r in streamed + whole + seq + conc if r.error]
    mismatches = sum(s.text != w.text or s.tokens != w.tokens for s, w in zip(streamed, whole))
    tokens = sum(r.tokens for r in streamed)
    seq_tok_s = sum(r.tokens for r in seq) / seq_wall
    conc_tok_s = sum(r.tokens for r in conc) / conc_wall
    figures = {
        "clients": args.clients, "requests": len(streamed), "errors": len(errors), "stream_mismatches": mismatches,
        "requests_per_s": round(len(streamed) / wall, 3), "tokens_per_s": round(tokens / wall, 2),
        "generated_tokens": tokens, "wall_s": round(wall, 2),
        "ttft_p50_s": percentile([r.ttft for r in streamed if r.ttft is not None], 50),
        "ttft_p99_s": percentile([r.ttft for r in streamed if r.ttft is not None], 99),
        "itl_p50_s": percentile([g for r in streamed for g in r.gaps], 50),
        "itl_p99_s": percentile([g for r in streamed for g in r.gaps], 99),
        "sequential_tokens_per_s": round(seq_tok_s, 2),
        f"concurrency{BATCHING_CONCURRENCY}_tokens_per_s": round(conc_tok_s, 2),
        f"concurrency{BATCHING_CONCURRENCY}_vs_sequential": round(conc_tok_s / seq_tok_s, 2),
        "server_exit_code": code,
    }
    say(f"{figures['requests_per_s']} requests/s, {figures['tokens_per_s']} tokens/s; TTFT p50 "
        f"{figures['ttft_p50_s']} s p99 {figures['ttft_p99_s']} s; ITL p50 {figures['itl_p50_s']} s p99 "
        f"{figures['itl_p99_s']} s; {len(errors)} errors, {mismatches} stream/non-stream mismatches")
    say(f"throughput: sequential {seq_tok_s:.1f} tok/s, {BATCHING_CONCURRENCY} at once {conc_tok_s:.1f} tok/s "
        f"= {conc_tok_s / seq_tok_s:.2f}x")
    for e in errors[:5]:
        say(f"error: {e}")
    print(json.dumps(figures))
    if errors or mismatches or code != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
