"""The request body limit, as ASGI middleware: a body over max_request_bytes is refused with 413
before it is read, never buffered, parsed or tokenized.

    Content-Length over the limit   413 at once; the app never runs and the body is never parsed
                                    (a client that sent `Expect: 100-continue` never sends it at all)
    no Content-Length (chunked)     bytes are counted as they arrive; the first message past the
                                    limit raises RequestTooLarge from receive(), answered 413
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine_builder.server.http_errors import TOO_LARGE, RequestTooLarge, error_body, is_openai_route


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, on_reject: Callable[[int], None]) -> None:
        self.app, self.max_bytes, self._on_reject = app, max_bytes, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLarge(self.max_bytes)  # answered by the app's HTTPException handler
            return message

        await self.app(scope, counting_receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._on_reject(TOO_LARGE.status)
        exc = RequestTooLarge(self.max_bytes)
        # the body is never read into memory: uvicorn discards it as it arrives, and where the client asked to
        # close the connection, unread_body.py drains it first, so a client that sends it all before reading
        # still gets this answer rather than a reset connection
        response = JSONResponse(error_body(is_openai_route(scope["path"]), TOO_LARGE, exc.detail),
                                status_code=TOO_LARGE.status)
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses a malformed Content-Length itself
    return None
