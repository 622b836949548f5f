"""`trtbuild serve` writes one access-log line per request on stderr: method, path, status, tokens in / out
and milliseconds, as text or (--log-format json) JSON; refusals before any route are logged too."""

from __future__ import annotations

import json
import re
import time

import httpx
from live_server import live_server

TEXT_LINE = re.compile(r'^127\.0\.0\.1 "(\w+) (\S+)" (\d{3}) in=(\d+) out=(\d+) (\d+\.\d)ms$')


def _access_lines(server, count: int, pattern=None) -> list[str]:
    deadline = time.monotonic() + 30
    while True:  # the line is written once the response's last byte is sent
        lines = [line for line in server.log().splitlines()
                 if (pattern.match(line) if pattern else line.startswith("{"))]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_text_access_log_counts_tokens(tiny_serve_engine):
    with live_server(tiny_serve_engine, "--api-key", "k") as server:
        auth = {"Authorization": "Bearer k"}
        r = httpx.post(f"{server.url}/v1/completions", headers=auth, timeout=120,
                       json={"prompt": "w1 w5 w9", "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        with httpx.stream("POST", f"{server.url}/generate_stream", headers=auth, timeout=120,
                          json={"inputs": "w3 w4", "parameters": {"max_new_tokens": 3}}) as s:
            assert s.status_code == 200 and list(s.iter_lines())
        assert httpx.get(f"{server.url}/health").status_code == 200
        assert httpx.post(f"{server.url}/v1/completions", json={"prompt": "w1"}).status_code == 401
        lines = _access_lines(server, 5, TEXT_LINE)[1:]  # the first: live_server's own /health check
    parsed = [TEXT_LINE.match(line).groups() for line in lines]
    assert [(m, p, s) for m, p, s, *_ in parsed] == [("POST", "/v1/completions", "200"),
                                                     ("POST", "/generate_stream", "200"),
                                                     ("GET", "/health", "200"), ("POST", "/v1/completions", "401")]
    completion, stream, health, refused = parsed
    assert (int(completion[3]), int(completion[4])) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert int(stream[3]) > 0 and 1 <= int(stream[4]) <= 3 and float(stream[5]) > 0
    assert (health[3], health[4], refused[3], refused[4]) == ("0", "0", "0", "0")


def test_json_access_log(tiny_serve_engine):
    with live_server(tiny_serve_engine, "--log-format", "json") as server:
        r = httpx.post(f"{server.url}/generate", timeout=120,
                       json={"inputs": "w1 w2", "parameters": {"max_new_tokens": 2}})
        assert r.status_code == 200
        _, line = _access_lines(server, 2)  # after live_server's own /health check
    entry = json.loads(line)
    assert {k: entry[k] for k in ("method", "path", "status")} == {"method": "POST", "path": "/generate",
                                                                     "status": 200}
    assert entry["tokens_in"] > 0 and 1 <= entry["tokens_out"] <= 2 and entry["ms"] > 0
