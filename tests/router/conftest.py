"""Router test fixtures: a tiny random Llama engine (word tokenizer "w0".."w319"), two `trtbuild serve` replicas of
it, and `trtbuild route` over them (route_processes.py), all real processes."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from route_processes import Replica, Router
from runner_engines import add_word_tokenizer, build_engine

from converters.convert import convert
from engine_builder.formats.build_config import Limits

ROUTER_LIMITS = Limits(max_batch=2, max_input_len=32, max_seq_len=96)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}assistant"


@pytest.fixture(scope="session")
def router_engine(tiny_model_dir, tmp_path_factory) -> Path:
    """A tiny random Llama engine (max_batch 2, max_input_len 32, max_seq_len 96), built in seconds."""
    root = tmp_path_factory.mktemp("tiny-route")
    hf = root / "hf"
    shutil.copytree(tiny_model_dir("llama"), hf)
    add_word_tokenizer(hf, 320)
    (hf / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    convert(hf, root / "ckpt", dtype="float32")
    return build_engine(root / "ckpt", root / "engine", ROUTER_LIMITS)


@pytest.fixture(scope="module")
def replicas(router_engine):
    """Two replicas, started together (their model loads overlap)."""
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: Replica(router_engine), range(2)))
    try:
        for r in started:
            assert httpx.get(f"{r.url}/health", timeout=30).status_code == 200
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture
def router_for(replicas):
    """router_for(policy): a router over the replicas, stopped at the test's end (cleanly: exit 0)."""
    routers = []

    def start(policy: str) -> Router:
        router = Router([r.url for r in replicas], policy)
        routers.append(router)
        for r in replicas:
            router.wait_healthy(r.url)
        return router

    yield start
    for router in routers:
        log = router.log()
        assert router.stop() == 0, log
