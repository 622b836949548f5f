"""route(): check the backends, then run the router's app on uvicorn until SIGINT/SIGTERM.

Bad input (no backend, a malformed URL, an unknown policy, a taken port) is a one-line InputError
before anything starts. A backend that is down at start-up is only logged: the health checks put it
in as soon as it answers, so the router and its replicas may start in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable

import httpx

from engine_builder.router.app import create_app
from engine_builder.router.backends import BackendPool
from engine_builder.router.policies import make_policy
from engine_builder.router.router_config import RouterConfig
from engine_builder.router.router_metrics import RouterMetrics
from engine_builder.util.listen_socket import bind, signals_ignored_after_uvicorn, url_of

# Seconds streams still running at SIGTERM get to finish before uvicorn cancels them
SHUTDOWN_TIMEOUT_S = 30.0


def route(backends: list[str] | tuple[str, ...], *, policy: str = "round-robin", host: str = "127.0.0.1",
          port: int = 8000, on_ready: Callable[[str], None] = print, log: Callable[[str], None] | None = None,
          **timings: float) -> None:
    """Route requests over BACKENDS (`trtbuild serve` base URLs) until SIGINT/SIGTERM. on_ready(url) runs
    once it accepts connections; log(line) gets backend changes (taken out, put back)."""
    config = RouterConfig.create(backends, policy, **timings)
    sock = bind(host, port)
    with contextlib.closing(sock), signals_ignored_after_uvicorn():
        asyncio.run(_run(config, sock, on_ready, log or (lambda line: None)))


async def _run(config: RouterConfig, sock: socket.socket, on_ready: Callable[[str], None],
               log: Callable[[str], None]) -> None:
    import uvicorn

    policy = make_policy(config.policy)
    pool = BackendPool(config.backends, on_down=policy.forget, log=log)
    metrics = RouterMetrics(pool)
    timeout = httpx.Timeout(config.backend_timeout, connect=config.connect_timeout)
    # no pool limit: the replicas' own --max-concurrent-requests is the limit (429 passed on); no proxies
    # from the environment: the backends are named by URL
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    transport = httpx.AsyncHTTPTransport(limits=limits, trust_env=False)  # the proxy's, shared with the checks
    async with httpx.AsyncClient(timeout=timeout, transport=transport, trust_env=False) as client:
        await pool.check_all(client, config.health_timeout)
        for b in pool.backends:
            if not b.healthy:
                log(f"backend {b.url} is not answering yet ({b.reason}); it is put in once healthy")
        checks = asyncio.create_task(pool.health_loop(client, config.health_interval, config.health_timeout))
        app = create_app(pool, policy, metrics, transport, timeout, config.first_byte_timeout)
        # lifespan off: nothing to start; access log off: a line per request costs more than /metrics tells
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                               timeout_graceful_shutdown=SHUTDOWN_TIMEOUT_S))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started and not task.done():
                await asyncio.sleep(0.02)
            if server.started:
                log(f"routing over {len(pool.backends)} backends ({config.policy}): "
                    + ", ".join(b.url for b in pool.backends))
                on_ready(url_of(sock))
                sys.stdout.flush()
            await task
        finally:
            checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checks
