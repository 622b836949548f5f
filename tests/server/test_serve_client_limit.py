"""--max-concurrent-per-client on a live server: a client address with a request in flight is refused its
next one (429, Retry-After, the route's error shape) while another address is served; GETs are never
limited; the count drops when a stream ends or its client leaves. Loopback addresses 127.0.0.2+ stand
for other clients (Linux routes all of 127/8 to lo)."""

from __future__ import annotations

import httpx
from live_server import metrics, sse_data, wait_idle

SERVER_ARGS = ("--max-concurrent-per-client", "1")
STREAM = {"prompt": "1, 2, 3,", "max_tokens": 60, "temperature": 0, "stream": True}  # counts on: ~1 s of tokens


def client(url: str, address: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, transport=httpx.HTTPTransport(local_address=address))


def test_one_request_in_flight_per_client_address(server):
    url = server.url
    before = metrics(url).get('trtbuild_requests_rejected_total{status="429"}', 0)
    with client(url, "127.0.0.1") as first, client(url, "127.0.0.2") as other:
        with first.stream("POST", "/v1/completions", json=STREAM) as stream:
            assert stream.status_code == 200
            events = sse_data(stream.iter_lines())  # held: a dropped iterator would close the connection
            next(events)  # admitted and generating
            r = first.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 429, r.text
            assert "max_concurrent_per_client 1" in r.json()["error"]["message"]
            assert r.headers["retry-after"] == "1"
            r = first.post("/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}})
            assert (r.status_code, r.json()["error_type"]) == (429, "overloaded")
            assert first.get("/health").status_code == 200  # GETs are not counted
            # another address is served meanwhile
            r = other.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert len(list(events)) > 1  # the first stream ran to its end
        wait_idle(url)
        # its stream over, the first address may send again
        assert first.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
        # a client that leaves mid-stream frees its count too
        with first.stream("POST", "/v1/completions", json=STREAM) as stream:
            next(sse_data(stream.iter_lines()))
        wait_idle(url)
        assert first.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
    assert metrics(url)['trtbuild_requests_rejected_total{status="429"}'] == before + 2
