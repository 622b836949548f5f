"""`trtbuild serve-triton` start-up refusals: one line on stderr, exit 2, nothing on stdout, before the engine
loads or Triton starts."""

from __future__ import annotations

import socket

from cli_process import assert_user_error, trtbuild


def test_serve_triton_refuses_a_taken_port_before_loading(tiny_serve_engine):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = trtbuild("serve-triton", tiny_serve_engine, "--grpc-port", str(port), timeout=120)
    assert_user_error(r, f"--grpc-port {port}", "choose a free port")
    assert r.stdout == ""
    assert_user_error(trtbuild("serve-triton", tiny_serve_engine, "--model-name", "a b"), "--model-name")
