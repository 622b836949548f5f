"""A replica SIGKILLed mid-stream: the stream through the router ends with its API's error event (OpenAI: the
error, then [DONE], which the openai client raises as APIError; TGI: incomplete_generation), never a hang.
SmolLM2 (the session's engine), whose 200-token answer takes seconds: the kill lands mid-stream."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from route_processes import Replica, Router

MESSAGES = [{"role": "user", "content": "Write a long story about the sea, the stars and an old fisherman."}]


@pytest.fixture
def replica_and_router(smollm2_engine):
    replica = Replica(smollm2_engine)
    router = Router([replica.url], "round-robin")
    try:
        router.wait_healthy(replica.url)
        yield replica, router
    finally:
        replica.stop()
        assert router.stop() == 0


def test_a_stream_cut_mid_way_ends_with_the_error_event(replica_and_router):
    replica, router = replica_and_router
    c = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=200, temperature=0, stream=True)
    received = ""
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received += chunk.choices[0].delta.content
                if len(received) > 20 and replica.server.proc.poll() is None:
                    replica.kill()
    assert received and len(received) < 1000  # some text came through before the cut, not the whole answer
    m = router.metrics()
    assert m["trtbuild_router_stream_aborts_total"] == 1
    assert m[f'trtbuild_router_backend_healthy{{backend="{replica.url}"}}'] == 0

    # TGI: the replica back, the same cut on /generate_stream ends with incomplete_generation
    replica.restart()
    router.wait_healthy(replica.url)
    body = {"inputs": "Once upon a time, by the sea,", "parameters": {"max_new_tokens": 200}}
    events = []
    with httpx.stream("POST", f"{router.url}/generate_stream", json=body, timeout=120) as s:
        for line in s.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if len(events) == 3:
                    replica.kill()
    assert 3 <= len(events) < 200 and "token" in events[0]
    assert events[-1]["error_type"] == "incomplete_generation" and "failed mid-stream" in events[-1]["error"]
