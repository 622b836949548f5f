"""A response whose client reads nothing is cancelled, as ASGI middleware: every send() of a response body may
block at most --stalled-stream-timeout seconds (uvicorn's send waits while the socket's buffers are full, i.e.
while the client reads nothing). Past it the request is cancelled (the stream's close frees its KV slot and
its admission) and the connection is closed.

A client that opens streams and never reads them otherwise keeps each request admitted for as long as it
likes: its generation ends, but its response never does, so it counts against --max-concurrent-requests
(and --max-concurrent-per-client) for ever.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("trtbuild.server")


class _Stalled(Exception):
    pass


class StalledClientMiddleware:
    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app, self.timeout = app, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def bounded_send(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            try:
                await asyncio.wait_for(send(message), self.timeout)
            except TimeoutError:
                raise _Stalled from None

        try:
            await self.app(scope, receive, bounded_send)
        except _Stalled:  # the response's own close ran on the way out (EventStream: the request is cancelled)
            client = (scope.get("client") or ("-", 0))[0]
            logger.warning("%s read nothing for %g s (--stalled-stream-timeout): its %s was cancelled",
                           client, self.timeout, scope.get("path"))
