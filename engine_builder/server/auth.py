"""API key check, as ASGI middleware so it runs before anything reads the body: a request without
the key gets 401 whatever else is wrong with it, and learns nothing about the API from a 422.

/health and /metrics stay open (load balancers and Prometheus scrape them without secrets), and
so do the API docs (/docs, /openapi.json), which hold no data.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine_builder.server.http_errors import UNAUTHORIZED, error_body, is_openai_route

OPEN_PATHS = frozenset({"/health", "/metrics", "/docs", "/openapi.json"})


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, on_reject: Callable[[int], None]) -> None:
        self.app = app
        self._key = api_key.encode()
        self._on_reject = on_reject

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # compare_digest: the time taken does not leak how much of the key matched
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        self._on_reject(UNAUTHORIZED.status)
        message = "missing or wrong API key; send the header `Authorization: Bearer <key>` with the server's key"
        response = JSONResponse(error_body(is_openai_route(scope["path"]), UNAUTHORIZED, message),
                                status_code=UNAUTHORIZED.status, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
