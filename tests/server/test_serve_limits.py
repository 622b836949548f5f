"""Issue 15, hostile input on a live `trtbuild serve` of the tiny engine: each attack gets a fast,
clear refusal in the protocol's error shape, and never slows /health down.

    body size        413 before the body is read (Content-Length, or counted while chunks arrive)
    tokenizing       a large prompt is tokenized off the event loop: /health answers meanwhile
    response size    top_n_tokens / top_logprobs / logprobs capped (422 / 400 naming the cap), stop sequences too
    bad encodings    a non-UTF-8 body or a lone surrogate is a 422 (TGI) / 400 (OpenAI) with one message,
                     never a 500
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import httpx
import pytest
from live_server import live_server, metrics

MAX_BYTES = 64 * 1024
SERVER_ARGS = ("--model-name", "tiny", "--max-request-bytes", str(MAX_BYTES))
# a prompt just under the body limit (~21k words, 700x --max-input-tokens): read, tokenized, refused
BIG_PROMPT = "w5 w7 w9 " * ((MAX_BYTES - 200) // 9)
# the same under the default limit (1 MiB): ~350k words to tokenize
HUGE_PROMPT = "w5 w7 w9 " * (((1 << 20) - 200) // 9)


def post(server, path, body=None, *, content=None, headers=None):
    return httpx.post(f"{server.url}{path}", json=body, content=content, headers=headers, timeout=60)


def assert_openai_error(r, status, *needles):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    for needle in needles:
        assert needle in err["message"], err["message"]


def assert_tgi_error(r, status, error_type, *needles):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_type"] == error_type, body
    for needle in needles:
        assert needle in body["error"], body["error"]


def raw_request(url: str, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """Send a request head (and maybe part of a body) over a plain socket; the response's status and JSON."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _content_length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def _content_length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30


# --- 1. body size and the event loop -----------------------------------------------------------------

def test_body_over_the_limit_is_413_before_it_is_read(tiny_server):
    """The original attack declared a 50 MB body: the answer comes before a byte of it is sent."""
    before = metrics(tiny_server.url).get('trtbuild_requests_rejected_total{status="413"}', 0)
    for path, openai in (("/generate", False), ("/v1/completions", True)):
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: 50000000\r\n\r\n").encode()
        status, body = raw_request(tiny_server.url, head)  # no body sent at all: the answer cannot wait for it
        assert status == 413
        message = body["error"]["message"] if openai else body["error"]
        assert f"larger than {MAX_BYTES} bytes" in message and "--max-request-bytes" in message
    # a client that sends the whole body before it reads (httpx, requests) gets the same answer
    r = post(tiny_server, "/generate", content=b"w" * (8 * MAX_BYTES), headers={"Content-Type": "application/json"})
    assert_tgi_error(r, 413, "validation", "--max-request-bytes")
    assert metrics(tiny_server.url)['trtbuild_requests_rejected_total{status="413"}'] == before + 3


@pytest.mark.parametrize(("path", "openai"), [("/generate", False), ("/v1/completions", True)])
def test_body_over_the_limit_is_413_for_a_client_that_sends_it_all_and_closes(tiny_server, path, openai):
    """Python's urllib sends the whole body before it reads, with `Connection: close`: uvicorn closed the
    socket on the 413 with 50 MB still coming, and urllib saw "connection reset" / "broken pipe" (issue 36
    LOW 11). The server now reads and drops the rest of the body first (server/unread_body.py)."""
    request = urllib.request.Request(f"{tiny_server.url}{path}", data=b"w" * 50_000_000,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    body = json.loads(refused.value.read())
    message = body["error"]["message"] if openai else body["error"]
    assert f"larger than {MAX_BYTES} bytes" in message and "--max-request-bytes" in message
    assert httpx.get(f"{tiny_server.url}/health", timeout=30).status_code == 200


def test_chunked_body_over_the_limit_is_413(tiny_server):
    """Without a Content-Length the bytes are counted as they arrive."""
    def chunks():
        yield b'{"inputs": "'
        for _ in range(4 * MAX_BYTES // 4096):
            yield b"w5 " * 1365 + b" "
        yield b'"}'

    r = httpx.post(f"{tiny_server.url}/generate", content=chunks(), timeout=60,
                   headers={"Content-Type": "application/json"})
    assert_tgi_error(r, 413, "validation", "--max-request-bytes")


def test_body_just_under_the_limit_is_read(tiny_server):
    r = post(tiny_server, "/generate", {"inputs": BIG_PROMPT})
    assert_tgi_error(r, 422, "validation", "max_input_tokens")  # read, tokenized, refused by length


def test_health_answers_while_large_prompts_are_tokenized(tiny_serve_engine):
    """A server with the default body limit (1 MiB); 2 clients post prompts just under it in a loop (each
    is read, tokenized and refused by length) while /health and /metrics are polled: every poll is answered
    while the flood goes on (a prompt was refused before the first poll, both clients still post after the last).
    How fast is a time, not asserted here (a loaded 2-core CI machine stretches it); the printed median is
    the figure issue 36's acceptance quotes. The client's 10 s timeout is a hang guard only."""
    with live_server(tiny_serve_engine) as server:
        stop, flooding = threading.Event(), threading.Event()
        refused = []

        def flood():
            with httpx.Client(base_url=server.url, timeout=60) as client:
                while not stop.is_set():
                    refused.append(client.post("/v1/completions", json={"prompt": HUGE_PROMPT}).status_code)
                    flooding.set()

        threads = [threading.Thread(target=flood) for _ in range(2)]
        for t in threads:
            t.start()
        latencies = []
        try:
            assert flooding.wait(120), "no 1 MiB prompt was refused in 120 s"  # the flood is under way
            with httpx.Client(base_url=server.url, timeout=10) as client:
                for i in range(60):
                    started = time.monotonic()
                    r = client.get("/health" if i % 2 else "/metrics")
                    latencies.append(time.monotonic() - started)
                    assert r.status_code == 200
                    time.sleep(0.02)
                assert all(t.is_alive() for t in threads)  # the flood went on through every poll
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert refused and set(refused) == {400}
    latencies.sort()
    print(f"/health and /metrics under the flood: median {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
          f"max {latencies[-1] * 1e3:.1f} ms ({len(refused)} prompts of 1 MiB refused meanwhile)")


# --- 2. response-size bounds -------------------------------------------------------------------------

@pytest.mark.parametrize("path, body, needle", [
    ("/generate", {"inputs": "w5", "parameters": {"top_n_tokens": 320, "details": True}}, "top_n_tokens must be at "
                                                                                          "most 20"),
    ("/generate", {"inputs": "w5", "parameters": {"stop": ["w1", "w2", "w3", "w4", "w6"]}}, "stop has 5 sequences"),
    ("/generate", {"inputs": "w5", "parameters": {"stop": ["w" * 257]}}, "has 257 characters"),
    ("/generate", {"inputs": "w5", "parameters": {"max_new_tokens": 10**9}}, "max_total_tokens 96"),
])
def test_tgi_bounds_are_422_naming_the_field_and_the_bound(tiny_server, path, body, needle):
    assert_tgi_error(post(tiny_server, path, body), 422, "validation", needle)


@pytest.mark.parametrize("path, body, needle", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs must be at most 20"),
    ("/v1/completions", {"prompt": "w5", "logprobs": 320}, "logprobs must be at most 20"),
    ("/v1/completions", {"prompt": "w5", "stop": ["a", "b", "c", "d", "e"]}, "at most 4 (max_stop_sequences"),
    ("/v1/completions", {"prompt": "w5", "stop": "x" * 1000}, "at most 256 (max_stop_sequence_chars"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": 10**9}, "max_total_tokens 96"),
    ("/v1/completions", {"prompt": "w5", "n": 17}, "n must be in [1, 16]"),
])
def test_openai_bounds_are_400_naming_the_field_and_the_bound(tiny_server, path, body, needle):
    assert_openai_error(post(tiny_server, path, body), 400, needle)


def test_requests_at_the_bounds_are_served(tiny_server):
    r = post(tiny_server, "/generate", {"inputs": "w5 w6", "parameters": {
        "max_new_tokens": 3, "top_n_tokens": 20, "details": True, "stop": ["w1", "w2", "w3", "w" * 256]}})
    assert r.status_code == 200, r.text
    assert all(len(top) == 20 for top in r.json()["details"]["top_tokens"])
    r = post(tiny_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2,
                                                   "logprobs": True, "top_logprobs": 20})
    assert r.status_code == 200, r.text
    assert all(len(c["top_logprobs"]) == 20 for c in r.json()["choices"][0]["logprobs"]["content"])
    # top_k past the vocabulary means "off" (a huge one once failed the whole batched sampling step)
    r = post(tiny_server, "/generate", {"inputs": "w5", "parameters": {"max_new_tokens": 2, "top_k": 2**63,
                                                                       "do_sample": True, "seed": 2**70}})
    assert r.status_code == 200, r.text


# --- 3. encodings --------------------------------------------------------------------------------------

JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("content, needle", [
    (b'{"inputs": "w5 \xff\xfe w6"}', "not valid UTF-8 (byte 0xff at offset 15)"),
    (b'{"inputs": "\\ud800 w5"}', "inputs: Value error, the text holds a lone surrogate '\\ud800'"),
    (b'{"inputs": "w5", "parameters": {"stop": ["\\udfff"]}}', "parameters.stop.0"),
    (b"[" * 20_000 + b"]" * 20_000, "nested too deeply"),
    (b"[1, 2]", "the body must be a JSON object"),
])
def test_bad_encodings_are_422_with_one_message(tiny_server, content, needle):
    for path in ("/generate", "/generate_stream"):
        r = post(tiny_server, path, content=content, headers=JSON)
        assert_tgi_error(r, 422, "validation", needle)
        assert "Traceback" not in r.text


@pytest.mark.parametrize("path, content, needle", [
    ("/v1/completions", b'{"prompt": "\xc3\x28"}', "not valid UTF-8"),
    ("/v1/completions", b'{"prompt": ["\\ud83d"], "echo": true}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udc80"}], "stream": true}',
     "messages.0.content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "lone surrogate"),
])
def test_bad_encodings_on_openai_routes_are_400(tiny_server, path, content, needle):
    r = post(tiny_server, path, content=content, headers=JSON)
    assert_openai_error(r, 400, needle)
    assert "Traceback" not in r.text


def test_valid_non_ascii_text_is_served(tiny_server):
    r = post(tiny_server, "/generate", {"inputs": "w5 héllo 東京 🙂", "parameters": {"max_new_tokens": 2,
                                                                                    "return_full_text": True}})
    assert r.status_code == 200 and r.json()["generated_text"].startswith("w5 héllo 東京 🙂")
