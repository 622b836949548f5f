"""In-flight batching behind HTTP, on a live server: clients that go away free their KV slots at
once (shown by /metrics), and a small load test where concurrent streams lose and duplicate no
token: each stream's text equals the non-streamed result of the same request and seed."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from live_server import metrics, sse_data, wait_idle

SERVER_ARGS = ("--model-name", "smollm2")
# greedy SmolLM2 counts on and on from here: a long request that will not stop by itself
COUNTING = "1, 2, 3,"
LONG = 200
WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree near "
         "the river where children play every summer afternoon and the sun sets slowly behind the hills").split()
CLIENTS, REQUESTS_PER_CLIENT = 16, 2
LOAD_TIMEOUT_S = 600


def counters(url):
    m = metrics(url)
    return m.get('trtbuild_requests_total{finish_reason="cancelled"}', 0.0), m["trtbuild_generated_tokens_total"]


def test_stream_disconnect_frees_the_slot(server):
    cancelled, tokens = counters(server.url)
    body = {"prompt": COUNTING, "max_tokens": LONG, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as stream:
        events = sse_data(stream.iter_lines())
        next(events), next(events)
        m = metrics(server.url)
        assert m["trtbuild_running_requests"] == 1 and m["trtbuild_kv_slots_free"] == m["trtbuild_kv_slots"] - 1
    # leaving the block closed the connection mid-stream
    m = wait_idle(server.url)
    assert m['trtbuild_requests_total{finish_reason="cancelled"}'] == cancelled + 1
    assert m["trtbuild_generated_tokens_total"] - tokens < LONG  # it stopped early, it did not run to the end


def test_non_streaming_disconnect_frees_the_slot(server):
    cancelled, tokens = counters(server.url)
    body = {"inputs": COUNTING, "parameters": {"max_new_tokens": LONG}}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s and closes the connection
        httpx.post(f"{server.url}/generate", json=body, timeout=httpx.Timeout(30, read=1.0))
    m = wait_idle(server.url)
    assert m['trtbuild_requests_total{finish_reason="cancelled"}'] == cancelled + 1
    assert m["trtbuild_generated_tokens_total"] - tokens < LONG


async def _openai_pair(client: httpx.AsyncClient, body: dict) -> tuple[str, str, int]:
    text, finish = "", None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert finish == choice["finish_reason"]
    return text, choice["text"], r.json()["usage"]["completion_tokens"]


async def _tgi_pair(client: httpx.AsyncClient, body: dict) -> tuple[str, str, int]:
    tokens = []
    async with client.stream("POST", "/generate_stream", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                tokens.append(json.loads(line[5:])["token"])
    r = await client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    details = r.json()["details"]
    assert [t["id"] for t in tokens] == [t["id"] for t in details["tokens"]]
    return "".join(t["text"] for t in tokens), r.json()["generated_text"], details["generated_tokens"]


async def _client(url: str, index: int) -> list[tuple[str, str, int, int]]:
    rng = random.Random(index)
    results = []
    async with httpx.AsyncClient(base_url=url, timeout=LOAD_TIMEOUT_S) as client:
        for _ in range(REQUESTS_PER_CLIENT):
            start = rng.randrange(len(WORDS))
            prompt = " ".join((WORDS[start:] + WORDS)[:rng.randint(1, 40)])
            new_tokens, seed = rng.randint(4, 24), rng.randrange(2**31)
            if index % 2:
                body = {"prompt": prompt, "max_tokens": new_tokens, "seed": seed, "temperature": 0.8}
                streamed, whole, n = await _openai_pair(client, body)
            else:
                body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "seed": seed,
                                                         "do_sample": True, "details": True}}
                streamed, whole, n = await _tgi_pair(client, body)
            results.append((streamed, whole, n, new_tokens))
    return results


def test_concurrent_streams_equal_non_streamed_results(server):
    """16 clients x 2 requests, random prompt lengths, lengths and seeds, all at once over 4 KV slots."""
    before = metrics(server.url)

    async def run() -> list[list[tuple[str, str, int, int]]]:
        clients = [_client(server.url, i) for i in range(CLIENTS)]
        return await asyncio.wait_for(asyncio.gather(*clients), LOAD_TIMEOUT_S)

    results = [r for client in asyncio.run(run()) for r in client]
    assert len(results) == CLIENTS * REQUESTS_PER_CLIENT
    for streamed, whole, n, new_tokens in results:
        assert streamed == whole
        assert 1 <= n <= new_tokens
    m = wait_idle(server.url)
    ended = {k: m.get(f'trtbuild_requests_total{{finish_reason="{k}"}}', 0) - before.get(
        f'trtbuild_requests_total{{finish_reason="{k}"}}', 0) for k in ("stop", "length", "cancelled", "error")}
    assert ended["stop"] + ended["length"] == 2 * len(results) and ended["cancelled"] == ended["error"] == 0
    assert m["trtbuild_generated_tokens_total"] - before["trtbuild_generated_tokens_total"] == 2 * sum(
        n for _, _, n, _ in results)
    assert m["trtbuild_time_to_first_token_seconds_count"] - before["trtbuild_time_to_first_token_seconds_count"] \
        == 2 * len(results)
    assert m["trtbuild_inter_token_latency_seconds_count"] > before["trtbuild_inter_token_latency_seconds_count"]
