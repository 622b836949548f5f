"""The replicas behind the router: each one's health and load, and the loop that checks their health.

A backend is taken out when a request cannot reach it (connection refused or reset, the stream cut)
or a health check fails (GET /health not 200 within the timeout), and put back by the first health
check that answers 200. One taken out because it sent no first byte in time (proxy.py) is held out for
HUNG_HOLD_S first: a hung replica may still answer /health, and each request it takes costs its client
the whole timeout. Taken out means no new request picks it; requests already streaming from it
keep going for as long as it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

# Seconds a replica taken out for a missed first byte stays out whatever its health checks say
HUNG_HOLD_S = 30.0


@dataclass(eq=False)
class Backend:
    url: str
    healthy: bool = False  # until the first check answers
    in_flight: int = 0  # requests forwarded and not yet ended (streams included)
    reason: str = "not checked yet"  # why it is out, for the log
    held_until: float = 0.0  # time.monotonic() before which no health check puts it back

    def __hash__(self) -> int:
        return id(self)


class BackendPool:
    def __init__(self, urls: tuple[str, ...], on_down: Callable[[Backend], None] | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.backends = [Backend(url) for url in urls]
        self._log = log or (lambda line: None)
        self._on_down = on_down  # the prefix index forgets a backend that went down: it restarts cold

    def healthy(self, exclude: set[Backend] = frozenset()) -> list[Backend]:
        return [b for b in self.backends if b.healthy and b not in exclude]

    def mark_down(self, backend: Backend, reason: str, hold_s: float = 0.0) -> None:
        if hold_s:
            backend.held_until = time.monotonic() + hold_s
        if backend.healthy:
            self._log(f"backend {backend.url} taken out: {reason}")
            if self._on_down is not None:
                self._on_down(backend)
        backend.healthy, backend.reason = False, reason

    def mark_up(self, backend: Backend) -> None:
        if not backend.healthy:
            self._log(f"backend {backend.url} is healthy" + ("" if backend.reason == "not checked yet" else
                                                              " again: put back"))
        backend.healthy, backend.reason = True, ""

    async def check(self, client: httpx.AsyncClient, backend: Backend, timeout: float) -> None:
        try:
            r = await client.get(f"{backend.url}/health", timeout=timeout)
        except httpx.HTTPError as exc:
            self.mark_down(backend, f"health check failed ({type(exc).__name__}: {exc or 'no answer'})")
            return
        if r.status_code == 200:
            if time.monotonic() >= backend.held_until:
                self.mark_up(backend)
        else:
            self.mark_down(backend, f"GET /health answered {r.status_code}")

    async def check_all(self, client: httpx.AsyncClient, timeout: float) -> None:
        await asyncio.gather(*(self.check(client, b, timeout) for b in self.backends))

    async def health_loop(self, client: httpx.AsyncClient, interval: float, timeout: float) -> None:
        """Check each backend every INTERVAL seconds until cancelled: one loop per backend, so a hung one
        (a check waiting out its timeout) never delays the checks of the others."""
        await asyncio.gather(*(self._check_loop(client, b, interval, timeout) for b in self.backends))

    async def _check_loop(self, client: httpx.AsyncClient, backend: Backend, interval: float, timeout: float) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):  # one bad check must never stop the checks
                await self.check(client, backend, timeout)
