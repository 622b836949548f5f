"""Graceful shutdown of a live server on SIGTERM: it stops accepting connections, lets an in-flight
stream finish (or cancels it once --shutdown-timeout has passed, ending it with its terminal event),
and exits 0."""

from __future__ import annotations

import signal
import time

import httpx
from live_server import LiveServer, sse_data

PROMPT = "1, 2, 3,"  # greedy SmolLM2 counts on: it runs to max_tokens


def _stream_body(max_tokens):
    return {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def _refuses_connections(url, within_s=30.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=2)
        except httpx.TransportError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_lets_the_in_flight_stream_finish(smollm2_engine, smollm2_llm):
    server = LiveServer(smollm2_engine, "--shutdown-timeout", "120")
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=_stream_body(24), timeout=120) as stream:
            events = sse_data(stream.iter_lines())
            first = next(events)
            server.proc.send_signal(signal.SIGTERM)
            assert _refuses_connections(server.url)
            rest = list(events)
        expected = smollm2_llm.generate(PROMPT, smollm2_llm.default_params(max_new_tokens=24, temperature=0))[0]
        chunks = [first, *rest[:-1]]
        assert rest[-1] == "[DONE]"
        assert "".join(c["choices"][0]["text"] for c in chunks) == expected.text
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        code = server.stop()
    assert code == 0, server.log()


def test_sigterm_cancels_streams_that_outlive_the_timeout(smollm2_engine):
    """Past --shutdown-timeout the stream is cancelled, and still ends properly: an error event, [DONE]."""
    server = LiveServer(smollm2_engine, "--shutdown-timeout", "1")
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", json=_stream_body(200), timeout=120) as stream:
            events = sse_data(stream.iter_lines())
            next(events)
            server.proc.send_signal(signal.SIGTERM)
            rest = list(events)
        assert rest[-1] == "[DONE]"
        assert rest[-2]["error"]["code"] == "unavailable" and "shutting down" in rest[-2]["error"]["message"]
        # cut: fewer than the 200 tokens asked for, none of them a finish
        assert len(rest) < 200 and all(c["choices"][0]["finish_reason"] is None for c in rest[:-2])
        server.proc.wait(60)  # it exits by itself (the 60 s are a hang guard: TimeoutExpired if it never does)
        assert server.proc.returncode == 0 and _refuses_connections(server.url)  # gone, nothing left listening
    finally:
        code = server.stop()
    assert code == 0, server.log()
