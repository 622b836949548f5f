"""Requests in flight per client address, as ASGI middleware: over --max-concurrent-per-client a POST is
refused with 429 (and Retry-After) before its body is read, tokenized or queued.

The global limit (max_concurrent_requests) keeps the queue short; it does not stop one client from
filling it. A client that opens streams and drops each after its first chunk pays nothing and costs the
server a prefill per stream: with 12 such connections beside 4 ordinary clients, the ordinary clients' p99
latency was 3.3x that of the same server unloaded (benchmarks/serve_soak.py). Counting per address bounds
what one client takes. The address is the TCP peer's, or the one a trusted proxy forwards when uvicorn's
proxy headers are on. A request is counted until its response ends (a stream: its last event, or the
client leaving). GETs (/health, /metrics, /v1/models) are never limited.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engine_builder.server.http_errors import OVERLOADED, error_response


class ClientLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int, on_reject: Callable[[int], None]) -> None:
        self.app, self.limit, self._on_reject = app, limit, on_reject
        self.in_flight: Counter[str] = Counter()  # address -> requests not yet answered (event loop only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("-", 0))[0]
        if self.in_flight[client] >= self.limit:
            self._on_reject(OVERLOADED.status)
            message = (f"{client} has {self.in_flight[client]} requests in flight (max_concurrent_per_client "
                       f"{self.limit}, --max-concurrent-per-client); wait for one to end, then retry")
            await error_response(Request(scope), OVERLOADED, message)(scope, receive, send)
            return
        self.in_flight[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]  # no entry per address ever seen: memory stays bounded
