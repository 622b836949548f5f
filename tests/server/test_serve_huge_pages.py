"""`trtbuild serve` (like run and chat) restarts itself once with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, so that
onnxruntime's weight buffers sit in huge pages (engine_builder/cli/huge_pages.py); TRTBUILD_HUGE_PAGES=off, or a
GLIBC_TUNABLES of the user's own, keeps the process as it started. The restart keeps the PID, so the running
server's /proc environ shows which happened; the answers are the same either way."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from live_server import live_server

from engine_builder import LLM, SamplingParams
from engine_builder.cli.huge_pages import TUNABLE, _glibc_has_hugetlb

PROMPT = "w5 w6 w7 w8"


@pytest.fixture(scope="module")
def want(tiny_serve_engine) -> str:
    with LLM(tiny_serve_engine) as llm:
        return llm.generate([PROMPT], SamplingParams(max_new_tokens=12, temperature=0))[0].text


def _tunables(pid: int) -> str | None:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    found = [e.split(b"=", 1)[1].decode() for e in entries if e.startswith(b"GLIBC_TUNABLES=")]
    return found[0] if found else None


@pytest.mark.parametrize("env, expected", [
    ({}, TUNABLE if _glibc_has_hugetlb() else None),  # glibc >= 2.35 on Linux: restarted with the tunable
    ({"TRTBUILD_HUGE_PAGES": "off"}, None),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc.malloc.arena_max=2"),  # the user's own, untouched
])
def test_serve_restarts_with_huge_pages_unless_told_not_to(tiny_serve_engine, want, monkeypatch, env, expected):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("TRTBUILD_HUGE_PAGES", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with live_server(tiny_serve_engine) as server:
        assert _tunables(server.proc.pid) == expected
        r = httpx.post(f"{server.url}/v1/completions", json={"model": "engine", "prompt": PROMPT, "max_tokens": 12,
                                                             "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
