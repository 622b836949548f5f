"""Router test fixtures: two `trtbuild serve` replicas of tests/conftest.py's tiny engine (word tokenizer
"w0".."w319") and `trtbuild route` over them (route_processes.py), all real processes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from route_processes import Replica, Router


@pytest.fixture(scope="module")
def replicas(tiny_serve_engine):
    """Two replicas, started together (their model loads overlap)."""
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: Replica(tiny_serve_engine), range(2)))
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
