"""`trtbuild serve` while grammars compile: /health latency, and the server's memory over many distinct schemas
(issue 36's acceptance: /health <= 100 ms while a request compiles a grammar; RSS flat, < 5 %, over 200 distinct
large schemas after warm-up).

    .venv/bin/python benchmarks/serve_grammar_load.py [--schemas 200] [--warmup 40] [--work build/bench-serve]
                                                      [--json]

SmolLM2-135M-Instruct fp32 on the onnxruntime twin (decode.py's engine build), one `trtbuild serve` subprocess.
Each schema is distinct and large for a JSON schema (~20 KB: an object of 150 typed, described properties, 20
required), sent as a /v1/chat/completions response_format with max_tokens 8, one after another, while a poller
GETs /health every 20 ms. Reported: /health latency (median, p99, max) during the compiles and without them, the
server's RSS after the warm-up schemas and at the end (the grammar cache is bounded by count and by bytes, so what
it holds stops growing), and how many answers finished "stop" with text failing its schema (target 0).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "server")]

from decode import engine_dirs  # noqa: E402
from serve_soak import rss_bytes  # noqa: E402


def schema(i: int) -> dict:
    props = {f"field_{i}_{j}": {"type": ["integer", "string", "boolean"][j % 3],
                                "description": f"property {j} of schema {i}: " + "x" * 60} for j in range(150)}
    return {"type": "object", "properties": props, "required": [f"field_{i}_{j}" for j in range(20)],
            "additionalProperties": False}


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(url: str, schemas: int, warmup: int, pid: int) -> dict:
    import httpx
    import jsonschema

    health: list[float] = []
    idle: list[float] = []
    compiling = asyncio.Event()
    done = asyncio.Event()

    slow: list[tuple[float, float]] = []  # (seconds into the compiles, latency) of polls over 100 ms
    begun = [0.0]

    async def poll(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            started = time.perf_counter()
            await client.get("/health")
            took = time.perf_counter() - started
            (health if compiling.is_set() else idle).append(took)
            if compiling.is_set() and took > 0.1:
                slow.append((round(started - begun[0], 2), round(took * 1e3, 1)))
            await asyncio.sleep(0.02)

    rss_after_warmup = 0
    broken = answered = refused = 0
    first_refusal = None
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        poller = asyncio.create_task(poll(client))
        await asyncio.sleep(2)  # /health alone first
        compiling.set()
        begun[0] = time.perf_counter()
        for i in range(schemas):
            s = schema(i)
            r = await client.post("/v1/chat/completions", json={
                "model": model, "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Fill in the record as JSON."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": s}}})
            if i + 1 == warmup:
                rss_after_warmup = rss_bytes(pid)
            if r.status_code != 200:
                refused += 1
                first_refusal = first_refusal or f"{r.status_code} {r.text[:200]}"
                continue
            answered += 1
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                try:
                    jsonschema.validate(json.loads(choice["message"]["content"]), s)
                except (ValueError, jsonschema.ValidationError):
                    broken += 1
        rss_end = rss_bytes(pid)
        done.set()
        await poller
    return {"schemas": schemas, "warmup": warmup, "schema_bytes": len(json.dumps(schema(0))),
            "answered": answered, "refused": refused, "first_refusal": first_refusal, "stop_but_invalid": broken,
            "health_ms_compiling": {"median": round(statistics.median(health) * 1e3, 1),
                                    "p99": round(quantile(health, 0.99) * 1e3, 1),
                                    "max": round(max(health) * 1e3, 1), "polls": len(health),
                                    "over_100ms": slow},
            "health_ms_idle": {"median": round(statistics.median(idle) * 1e3, 1),
                               "max": round(max(idle) * 1e3, 1), "polls": len(idle)},
            "rss_after_warmup_mb": round(rss_after_warmup / 1e6, 1), "rss_end_mb": round(rss_end / 1e6, 1),
            "rss_growth": round(rss_end / rss_after_warmup - 1, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemas", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--work", type=Path, default=Path("build/bench-serve"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from live_server import LiveServer

    args.work.mkdir(parents=True, exist_ok=True)
    engine = engine_dirs(args.work, ["default"], 8, 64)["default"]
    server = LiveServer(engine)
    # the client's own collections (its 200 schemas as dicts, jsonschema's validators) paused its poller 177-186 ms
    # once a run, which it counted as /health latency: this process measures, so it does not collect meanwhile
    gc.disable()
    try:
        result = asyncio.run(run(server.url, args.schemas, args.warmup, server.proc.pid))
    finally:
        gc.enable()
        result_code = server.stop()
    result["server_exit_code"] = result_code
    if args.json:
        print(json.dumps(result, indent=2))
        return
    h, i = result["health_ms_compiling"], result["health_ms_idle"]
    print(f"{args.schemas} distinct {result['schema_bytes']}-byte schemas: {result['answered']} answered, "
          f"{result['refused']} refused, {result['stop_but_invalid']} finished 'stop' failing their schema")
    print(f"/health while compiling: median {h['median']} ms, p99 {h['p99']} ms, max {h['max']} ms "
          f"({h['polls']} polls; over 100 ms at [s into the run, ms]: {h['over_100ms']}); idle median {i['median']} "
          f"ms, max {i['max']} ms")
    print(f"server RSS {result['rss_after_warmup_mb']} MB after {args.warmup} schemas -> {result['rss_end_mb']} MB "
          f"at the end ({result['rss_growth']:+.1%})")


if __name__ == "__main__":
    main()
