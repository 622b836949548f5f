"""Bounds on connections, below the ASGI app (which sees a request only once its headers are complete).

    header timeout    a connection must complete a request's headers within --header-timeout seconds of
                      opening, or of its previous response's end; else it is closed. A client that opens
                      connections and sends nothing, or its headers a byte a second, held them for ever.
    idle keep-alive   uvicorn's own timeout_keep_alive (5 s after a response) closes an idle kept-alive
                      connection before the header timeout does.
    open connections  --max-connections: uvicorn's limit_concurrency; beyond it a new request is answered
                      503 at once instead of piling up connections and tasks.
"""

from __future__ import annotations

import asyncio
from typing import Any

# Seconds from a connection's start (or its last response's end) to a request's complete headers: ample for
# any client on any network; a request's body is bounded by --max-request-bytes and its handling by
# --request-timeout, not by this.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# Open connections (and their tasks) beyond which uvicorn answers 503: well above max_concurrent_requests
# (128) plus a router's kept-alive pool, far below what exhausts file descriptors (ulimit 1024+).
DEFAULT_MAX_CONNECTIONS = 1000


def bounded_protocol(header_timeout: float) -> type:
    """uvicorn's h11 protocol, closing a connection whose next request's headers are late."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            # a request whose headers completed has a cycle still responding: that one is not late
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
