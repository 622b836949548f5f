"""Forward one request to a backend, with failover, and relay its answer.

Per request: the policy picks a healthy backend not tried yet; the request goes to it through httpx.
  - unreachable, cut before its answer was read (non-streaming), or cut before the first chunk of a
    stream: the backend is taken out and the request goes to the next backend (nothing was sent to the
    client yet, so a retry is invisible to it). A 503 (replica stopping) is retried the same way.
  - a stream is relayed chunk by chunk as the backend writes it; if the backend dies mid-stream the
    stream ends with the API's error event (and [DONE] on OpenAI routes): the client never hangs.
  - no first byte within --first-byte-timeout (a stream's first event, a non-streamed answer whole): the
    backend is taken out as hung (held out for backends.HUNG_HOLD_S whatever its /health says) and the
    request goes to the next backend, as above.
  - the client leaves before the first byte: the backend's request is closed (so `serve` cancels it and
    frees its KV slot) and nothing is retried; a stream's client leaving later closes it the same way.
  - anything else the backend answers (200, 4xx, other 5xx) goes to the client unchanged: status, body
    and headers (but the hop-by-hop ones).
No backend left: 503 with Retry-After in the API's error shape (api_errors.py).

Requests go to httpx's transport (its connection pool), not through an httpx.Client: a client keeps a cookie
jar (a Set-Cookie from a replica would be sent on every later user's request), merges its default headers and
runs its auth and redirect layers, none of which a proxy wants, and that was about a sixth of the router's CPU
per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import Request, Response
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine_builder.router import api_errors
from engine_builder.router.backends import HUNG_HOLD_S, Backend, BackendPool
from engine_builder.router.policies import Policy
from engine_builder.router.prompt_text import prompt_text
from engine_builder.router.router_metrics import RouterMetrics

# Headers that describe one connection, not the message (RFC 9110 §7.6.1), and those the other side
# sets itself (length, framing, encoding: httpx decodes non-streamed bodies; the server adds date/server)
_REQUEST_DROP = frozenset({b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te",
                           b"upgrade", b"proxy-authorization", b"proxy-connection", b"trailer", b"accept-encoding"})
_RESPONSE_DROP = frozenset({b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"upgrade",
                            b"trailer", b"date", b"server", b"content-encoding"})
RETRIED_STATUSES = frozenset({503})


def _forwarded_for(headers: list[tuple[bytes, bytes]], client: str | None) -> list[tuple[bytes, bytes]]:
    """The client's own address appended to X-Forwarded-For. serve (uvicorn) trusts that header from the router
    on 127.0.0.1 and takes its right-most untrusted address as the client's: without this, every request counted
    as the router's (one --max-concurrent-per-client for all users), or as whatever address a client wrote in
    the header itself, which passed through."""
    if client is None:
        return headers
    sent = [v.decode("latin-1") for k, v in headers if k.lower() == b"x-forwarded-for"]
    value = ", ".join([*sent, client]).encode("latin-1")
    return [(k, v) for k, v in headers if k.lower() != b"x-forwarded-for"] + [(b"x-forwarded-for", value)]


class _Failed(Exception):
    """The attempt failed before anything reached the client: try another backend."""


class _ClientGone(Exception):
    """The client disconnected before the first byte: nobody is left to answer."""


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects. The body was read already, so the next ASGI message is
    http.disconnect; cancelled before the response starts (a StreamingResponse listens for it itself)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class RelayedStream(StreamingResponse):
    """A backend's SSE stream passed on; on_close runs however it ends (finished, backend cut, client gone,
    or never started because the client left first), so the backend's request is always closed."""

    def __init__(self, body: AsyncIterator[bytes], status_code: int, raw_headers: list[tuple[bytes, bytes]],
                 on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, status_code=status_code)
        self.raw_headers.extend(raw_headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class Proxy:
    def __init__(self, pool: BackendPool, policy: Policy, metrics: RouterMetrics, transport: httpx.AsyncBaseTransport,
                 timeout: httpx.Timeout, first_byte_timeout: float | None = None) -> None:
        self.pool, self.policy, self.metrics, self.transport = pool, policy, metrics, transport
        self.first_byte_timeout = first_byte_timeout
        self._extensions = {"timeout": timeout.as_dict()}  # what httpx.Client would attach to each request

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        prompt = prompt_text(path, body) if self.policy.uses_prompt else ""
        headers = _forwarded_for([(k, v) for k, v in request.headers.raw if k.lower() not in _REQUEST_DROP],
                                 request.client.host if request.client else None)
        tried: set[Backend] = set()
        while candidates := self.pool.healthy(exclude=tried):
            backend = self.policy.choose(candidates, prompt)
            tried.add(backend)
            last = not self.pool.healthy(exclude=tried)
            try:
                return await self._attempt(backend, request, headers, body, retry_503=not last)
            except _ClientGone:  # nobody reads it: nginx's "client closed request"
                return Response(status_code=499)
            except _Failed:
                if self.pool.healthy(exclude=tried):
                    self.metrics.retries.inc()
        self.metrics.unrouted.inc()
        return api_errors.no_backend(path, len(tried))

    async def _attempt(self, backend: Backend, request: Request, headers: list[tuple[bytes, bytes]], body: bytes,
                       retry_503: bool) -> Response:
        url = backend.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        outgoing = httpx.Request(request.method, url, headers=headers, content=body, extensions=self._extensions)
        backend.in_flight += 1
        self.metrics.requests.labels(backend.url).inc()
        closed = False

        async def close(resp: httpx.Response | None) -> None:
            nonlocal closed
            if not closed:
                closed = True
                backend.in_flight -= 1
                if resp is not None:
                    await resp.aclose()

        resp: httpx.Response | None = None

        async def first_byte() -> tuple[bool, Any]:
            """(streaming, the stream's first chunk and its iterator | the whole answer)."""
            nonlocal resp
            resp = await self.transport.handle_async_request(outgoing)
            if resp.status_code >= 500:
                self.metrics.errors.labels(backend.url).inc()
                if resp.status_code in RETRIED_STATUSES and retry_503:
                    self.pool.mark_down(backend, f"it answered {resp.status_code}")
                    raise _Failed
            if resp.headers.get("content-type", "").startswith("text/event-stream"):
                chunks = resp.aiter_raw()
                return True, (await anext(chunks, b""), chunks)  # a replica that dies in prefill is retried
            return False, await resp.aread()  # the whole answer: a replica that dies before it is retried

        waiting = asyncio.ensure_future(first_byte())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({waiting, gone}, timeout=self.first_byte_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if waiting not in done:  # hung, or its client left: the backend's request is closed either way
                waiting.cancel()
                with contextlib.suppress(BaseException):
                    await waiting
                await close(resp)
                if gone in done:
                    raise _ClientGone
                self.metrics.errors.labels(backend.url).inc()
                self.pool.mark_down(backend, f"no first byte within {self.first_byte_timeout:g} s "
                                             "(--first-byte-timeout)", hold_s=HUNG_HOLD_S)
                raise _Failed
            streaming, got = waiting.result()
        except httpx.TransportError as exc:
            self.metrics.errors.labels(backend.url).inc()
            self.pool.mark_down(backend, f"{type(exc).__name__}: {exc or 'connection lost'}")
            await close(resp)
            raise _Failed from None
        except (_Failed, _ClientGone):
            await close(resp)
            raise
        except BaseException:
            waiting.cancel()
            await close(resp)
            raise
        finally:
            gone.cancel()
        assert resp is not None
        out_headers = [(k.lower(), v) for k, v in resp.headers.raw if k.lower() not in _RESPONSE_DROP]
        if not streaming:
            await close(resp)
            response = Response(got, status_code=resp.status_code)
            response.raw_headers.extend(out_headers)
            return response
        first, chunks = got
        return RelayedStream(self._relay(backend, request.url.path, first, chunks), resp.status_code, out_headers,
                             on_close=lambda: close(resp))

    async def _relay(self, backend: Backend, path: str, first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[
            bytes]:
        tail = first[-2:]
        if first:
            yield first
        try:
            async for chunk in chunks:
                if chunk:
                    tail = (tail + chunk)[-2:]
                    yield chunk
        except httpx.TransportError as exc:
            self.metrics.errors.labels(backend.url).inc()
            self.metrics.stream_aborts.inc()
            self.pool.mark_down(backend, f"stream cut ({type(exc).__name__})")
            # a cut inside an event: end it first, so the error event parses as an event of its own
            yield (b"" if tail in (b"", b"\n\n") else b"\n\n") + api_errors.stream_cut_events(path, backend.url)
