"""How requests end when generation is slow, fails or outlives --request-timeout, on the app served by a
real uvicorn (in a thread of this process) over a real Executor on the tiny engine whose every decode
step is slowed to STEP_S, so a request takes seconds. Real clients: httpx and the openai package.

    timeout      504 (non-streaming), or the stream's terminal timeout event; the KV slot is freed
    failure      a server bug mid-stream still ends the stream with an error event (and [DONE])
    disconnect   counted as a disconnect (finish_reason cancelled), never as a rejected 503
    busy/stopped 429 and 503 carry Retry-After
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from live_server import metrics, sse_data, wait_idle

from engine_builder import LLM
from engine_builder.executor import Executor
from engine_builder.server.asgi_app import create_app
from engine_builder.server.config import ServerConfig

STEP_S = 0.05  # per decode step: 60 new tokens take 3 s
TIMEOUT_S = 1.0
LONG = {"inputs": "w5 w6", "parameters": {"max_new_tokens": 60}}


@contextlib.contextmanager
def threaded_uvicorn(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.server
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@pytest.fixture(scope="module")
def slow(tiny_serve_engine):
    """(url, ServerState) of the slowed app: --request-timeout 1, --max-concurrent-requests 1."""
    llm = LLM(tiny_serve_engine, backend="onnxruntime")
    decode = llm.generator.decode

    def slow_decode(*args, **kwargs):
        time.sleep(STEP_S)
        return decode(*args, **kwargs)

    llm.generator.decode = slow_decode
    executor = Executor(llm)
    config = ServerConfig.for_engine(llm.engine.limits, "tiny", request_timeout=TIMEOUT_S, max_concurrent_requests=1)
    try:
        with threaded_uvicorn(create_app(executor, config)) as served:
            yield served
    finally:
        executor.shutdown(drain=False)
        llm.close()


def counter(url, name, label=None):
    key = f"{name}{{{label}}}" if label else name
    return metrics(url).get(key, 0.0)


def test_non_streaming_request_over_the_timeout_is_504_and_frees_its_slot(slow):
    url, _ = slow
    before = counter(url, "trtbuild_requests_total", 'finish_reason="timeout"')
    tokens = counter(url, "trtbuild_generated_tokens_total")
    started = time.monotonic()
    r = httpx.post(f"{url}/generate", json=LONG, timeout=30)  # 30 s: a hang guard, not a time bound
    assert r.status_code == 504 and r.json()["error_type"] == "incomplete_generation"
    assert "--request-timeout" in r.json()["error"] and "Traceback" not in r.text
    assert time.monotonic() - started >= TIMEOUT_S  # never ended early (a lower bound: load only adds to it)
    m = wait_idle(url)  # the slot is freed
    assert m['trtbuild_requests_total{finish_reason="timeout"}'] == before + 1
    # the timeout cut it: its 60 steps sleep 3 s, so a request that ran to the end would have made 60 tokens
    assert m["trtbuild_generated_tokens_total"] - tokens < LONG["parameters"]["max_new_tokens"]
    assert m.get('trtbuild_requests_rejected_total{status="504"}', 0) == 0  # an end, not a refusal
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 60}, timeout=30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"


def test_streams_over_the_timeout_end_with_their_terminal_event(slow):
    url, _ = slow
    with httpx.stream("POST", f"{url}/generate_stream", json=LONG, timeout=30) as s:
        events = list(sse_data(s.iter_lines()))
    assert 0 < len(events) - 1 < 60 and all("token" in e for e in events[:-1])
    assert events[-1]["error_type"] == "incomplete_generation" and "--request-timeout" in events[-1]["error"]
    wait_idle(url)

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w5"}],
                                            max_tokens=60, stream=True)
    with pytest.raises(openai.APIError, match="--request-timeout"):  # the client raises on the error event
        list(stream)
    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 60, "stream": True},
                      timeout=30) as s:
        events = list(sse_data(s.iter_lines()))
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
    wait_idle(url)


def test_a_failure_mid_stream_still_ends_the_stream(slow):
    """A bug while formatting the 3rd token: the stream gets an error event (+ [DONE]), not a cut."""
    url, state = slow
    texts, calls = state.token_texts, 0

    def failing(token_id):
        nonlocal calls
        calls += 1
        if calls >= 3:
            raise RuntimeError("boom")
        return texts(token_id)

    state.token_texts = failing
    state.token_texts.special_ids = texts.special_ids
    try:
        body = {"inputs": "w5", "parameters": {"max_new_tokens": 8, "details": True, "top_n_tokens": 1}}
        with httpx.stream("POST", f"{url}/generate_stream", json=body, timeout=30) as s:
            events = list(sse_data(s.iter_lines()))
        assert events[-1]["error_type"] == "generation" and "internal server error" in events[-1]["error"]
        assert "boom" not in str(events) and "Traceback" not in str(events)
        calls = 0
        body = {"prompt": "w5", "max_tokens": 8, "logprobs": 1, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as s:
            events = list(sse_data(s.iter_lines()))
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "internal_error"
    finally:
        state.token_texts = texts
    wait_idle(url)


def test_client_disconnects_count_as_disconnects_not_503(slow):
    url, _ = slow
    before = metrics(url)
    with pytest.raises(httpx.ReadTimeout):  # non-streaming: the client gives up and closes the connection
        httpx.post(f"{url}/generate", json=LONG, timeout=httpx.Timeout(30, read=0.4))
    wait_idle(url)  # the slot is freed within a poll interval (--max-concurrent-requests 1: else a 429)
    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "w5", "max_tokens": 60, "stream": True},
                      timeout=30) as s:
        assert s.status_code == 200
        events = sse_data(s.iter_lines())
        next(events), next(events)  # streaming: leave after two tokens
    m = wait_idle(url)
    assert m["trtbuild_client_disconnects_total"] - before.get("trtbuild_client_disconnects_total", 0) == 2
    assert m['trtbuild_requests_total{finish_reason="cancelled"}'] - before.get(
        'trtbuild_requests_total{finish_reason="cancelled"}', 0) == 2
    assert not any(k.startswith("trtbuild_requests_rejected_total") and m[k] != before.get(k, 0) for k in m)


def test_429_carries_retry_after(slow):
    url, _ = slow
    with httpx.stream("POST", f"{url}/generate_stream", json=LONG, timeout=30) as s:
        events = sse_data(s.iter_lines())
        next(events)  # admitted: the server (--max-concurrent-requests 1) is full
        r = httpx.post(f"{url}/generate", json={"inputs": "w5"}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "w5"}, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
    wait_idle(url)


def test_503_carries_retry_after(tiny_serve_engine):
    with LLM(tiny_serve_engine, backend="onnxruntime") as llm:
        executor = Executor(llm)
        with threaded_uvicorn(create_app(executor, ServerConfig.for_engine(llm.engine.limits, "tiny"))) as (url, _):
            executor.shutdown()
            for r in (httpx.get(f"{url}/health"), httpx.post(f"{url}/generate", json={"inputs": "w5"}),
                      httpx.post(f"{url}/v1/completions", json={"prompt": "w5"})):
                assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text


def test_a_stream_whose_client_reads_nothing_is_cancelled_and_frees_its_slot(slow):
    """Issue 36 MEDIUM 7: the app itself (a second one over the same executor, --stalled-stream-timeout 0.5) with
    uvicorn's side played by an ASGI send that never returns once the body starts, as uvicorn's send blocks on a
    socket whose client reads nothing (loopback buffers hold megabytes: more than this tiny engine can write)."""
    url, state = slow
    cancelled = state.executor.stats().requests_cancelled
    app = create_app(state.executor, dataclasses.replace(state.config, stalled_stream_timeout=0.5))
    body = json.dumps(LONG).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/generate_stream", "raw_path": b"/generate_stream",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    statuses = []

    async def serve_one() -> None:
        requests = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if requests:
                return requests.pop()
            await asyncio.Event().wait()  # the client never hangs up

        async def send(message):
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
            elif message["type"] == "http.response.body":
                await asyncio.Event().wait()  # and never reads

        await asyncio.wait_for(app(scope, receive, send), 30)  # returns: the stalled stream was given up

    asyncio.run(serve_one())
    assert statuses == [200] and app.state.server.active == 0
    wait_idle(url)  # the executor freed the KV slot
    assert state.executor.stats().requests_cancelled == cancelled + 1  # cancelled, not left to run to its end
