"""`trtbuild serve` start-up errors: one line on stderr, exit 2, before the model is loaded."""

from __future__ import annotations

import socket

import pytest
from cli_process import assert_user_error, trtbuild


def serve(*args):
    return trtbuild("serve", *args, timeout=120)


@pytest.mark.parametrize("flags, needles", [
    (("--max-input-tokens", "100000"), ("--max-input-tokens 100000", "max_input_len", "128")),
    (("--max-total-tokens", "100000"), ("--max-total-tokens 100000", "max_seq_len", "256")),
    (("--max-input-tokens", "64", "--max-total-tokens", "64"), ("above --max-input-tokens 64",)),
    (("--max-batch", "99"), ("max_batch 99", "4 or less")),
    (("--max-concurrent-requests", "0"), ("--max-concurrent-requests must be >= 1",)),
    (("--max-concurrent-per-client", "0"), ("--max-concurrent-per-client must be >= 1",)),
    (("--client-share", "-1"), ("--client-share must be >= 0 (0 turns it off)",)),
    (("--backend", "cuda"), ("backend 'cuda'",)),
    (("--api-key", " "), ("--api-key is empty",)),
    (("--port", "70000"), ("--port must be in [0, 65535]",)),
    (("--max-request-bytes", "10"), ("--max-request-bytes must be >= 1024",)),
    (("--request-timeout", "0"), ("--request-timeout must be a number of seconds > 0",)),
    (("--max-top-logprobs", "-1"), ("--max-top-logprobs must be >= 0",)),
    (("--max-stop-sequences", "-1"), ("--max-stop-sequences must be >= 0",)),
    (("--max-stop-sequence-chars", "0"), ("--max-stop-sequence-chars must be >= 1",)),
    (("--max-num-batched-tokens", "0"), ("--max-num-batched-tokens must be >= 1",)),
    (("--kv-budget-tokens", "8"), ("--kv-budget-tokens 8 holds no 16-token block",)),
])
def test_bad_flags_fail_in_one_line(smollm2_engine, flags, needles):
    r = serve(smollm2_engine, *flags)
    assert_user_error(r, *needles)
    assert r.stdout == ""


def test_port_in_use_fails_in_one_line(smollm2_engine):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = serve(smollm2_engine, "--port", taken.getsockname()[1])
    assert r.returncode == 2 and "cannot listen on 127.0.0.1" in r.stderr and "--port" in r.stderr


def test_not_an_engine_dir_fails_in_one_line(tmp_path):
    assert_user_error(serve(tmp_path / "missing"))


def test_help_teaches_the_endpoints():
    r = serve("--help")
    assert r.returncode == 0
    for needle in ("/generate_stream", "/v1/chat/completions", "/metrics", "TRTBUILD_API_KEY", "curl"):
        assert needle in r.stdout
