"""One access-log line per HTTP request: method, path, status, tokens in / out, milliseconds.

    127.0.0.1 "POST /v1/chat/completions" 200 in=31 out=16 412.3ms
    {"client": "127.0.0.1", "method": "POST", "path": "/v1/chat/completions", "status": 200, "tokens_in": 31, ...}

A pure ASGI middleware, outermost, so requests refused before any route (401, 413) are logged too and
a streamed response is timed to its last byte. Token counts come from the request the route admitted
(generation.admit calls `track`): a context variable carries this request's record from the middleware
to the route, which runs in the same context (streaming bodies included), so no route needs a
parameter for it. Requests that generate nothing log in=0 out=0.
"""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS = ("text", "json")


@dataclass
class _Usage:
    requests: list[Any] = field(default_factory=list)  # the ActiveRequests this HTTP request admitted

    def tokens(self) -> tuple[int, int]:
        return (sum(r.prompt_tokens for r in self.requests), sum(r.completion_tokens for r in self.requests))


_CURRENT: contextvars.ContextVar[_Usage | None] = contextvars.ContextVar("trtbuild_access_usage", default=None)


def track(active: Any) -> None:
    """Count ACTIVE's prompt and completion tokens in the current HTTP request's log line (if logging)."""
    usage = _CURRENT.get()
    if usage is not None:
        usage.requests.append(active)


def format_line(fmt: LogFormat, client: str, method: str, path: str, status: int, tokens_in: int,
                tokens_out: int, ms: float) -> str:
    if fmt == "json":
        return json.dumps({"client": client, "method": method, "path": path, "status": status,
                           "tokens_in": tokens_in, "tokens_out": tokens_out, "ms": round(ms, 1)})
    return f'{client} "{method} {path}" {status} in={tokens_in} out={tokens_out} {ms:.1f}ms'


class AccessLogMiddleware:
    def __init__(self, app: Any, write: Callable[[str], None], fmt: LogFormat = "text") -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
        self.app, self.write, self.fmt = app, write, fmt

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        usage = _Usage()
        token = _CURRENT.set(usage)

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            _CURRENT.reset(token)
            client = scope.get("client") or ("-", 0)
            tokens_in, tokens_out = usage.tokens()
            self.write(format_line(self.fmt, str(client[0]), scope.get("method", "-"), scope.get("path", "-"),
                                   status or 500, tokens_in, tokens_out, (time.perf_counter() - started) * 1e3))
