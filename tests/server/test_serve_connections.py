"""Connection bounds of `trtbuild serve` (issue 36, MEDIUM 7): a connection that sends no request, or its headers
a byte at a time, is closed after --header-timeout; past --max-connections a request is answered 503 at once.
Raw sockets against a live server of the tiny engine. (A stream whose client reads nothing: test_serve_stream_ends.py,
where a request lasts long enough to be stuck mid-stream.)"""

from __future__ import annotations

import socket
import time

import httpx

SERVER_ARGS = ("--header-timeout", "1", "--max-connections", "4")
WAIT_S = 60  # a bound for the waits below, never an assertion on time


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def _closed_by_server(sock: socket.socket, trickle: bytes = b"") -> bool:
    """Send TRICKLE a byte every 0.1 s (nothing if empty) until the server closes the connection."""
    deadline = time.monotonic() + WAIT_S
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.send(trickle[sent % len(trickle):sent % len(trickle) + 1])
                sent += 1
            if sock.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return True
    return False


def test_a_connection_that_sends_nothing_is_closed(tiny_server):
    with _connect(tiny_server.url) as sock:
        assert _closed_by_server(sock)


def test_headers_sent_a_byte_at_a_time_are_cut_off(tiny_server):
    with _connect(tiny_server.url) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        assert _closed_by_server(sock, trickle=b"X-Slow: " + b"a" * 200)  # a header line never ended


def test_past_max_connections_a_request_is_503_until_idle_ones_are_closed(tiny_server):
    idle = [_connect(tiny_server.url) for _ in range(4)]
    try:
        assert httpx.get(f"{tiny_server.url}/health", timeout=WAIT_S).status_code == 503
        deadline = time.monotonic() + WAIT_S
        while httpx.get(f"{tiny_server.url}/health", timeout=WAIT_S).status_code != 200:  # the header timeout
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        for s in idle:
            s.close()
    r = httpx.post(f"{tiny_server.url}/generate", json={"inputs": "w3 w4", "parameters": {"max_new_tokens": 3}},
                   timeout=WAIT_S)
    assert r.status_code == 200 and r.json()["generated_text"]

