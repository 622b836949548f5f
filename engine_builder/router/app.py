"""The router's ASGI app: its own /health and /metrics (FastAPI); every other route is forwarded to a replica.

    app = create_app(pool, make_policy("prefix-aware"), metrics, httpx.AsyncHTTPTransport())

Forwarded requests go straight from the ASGI scope to the proxy, not through FastAPI's middleware stack,
routing and endpoint machinery: that cost about a fifth of the router's CPU per request (measured with a
CPU-time profile of GET /v1/models through the router) for routes it only passes on.

Forwarded: POST /generate, /generate_stream, / (TGI); POST /v1/completions, /v1/chat/completions,
GET /v1/models (OpenAI); and whatever else `serve` answers (/docs, /openapi.json), unknown routes
included (the replica's 404, in its API's shape).
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from engine_builder.router.api_errors import no_backend
from engine_builder.router.backends import BackendPool
from engine_builder.router.policies import Policy
from engine_builder.router.proxy import Proxy
from engine_builder.router.router_metrics import CONTENT_TYPE, RouterMetrics
from engine_builder.util.version import __version__

FORWARDED_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
OWN_ROUTES = frozenset({"/health", "/metrics"})  # GET and HEAD; any other method on them is forwarded


class RouterApp:
    """The proxy for forwarded requests, FastAPI for the router's own routes and for what it refuses (405)."""

    def __init__(self, api: ASGIApp, proxy: Proxy) -> None:
        self.api, self.proxy = api, proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] in FORWARDED_METHODS
                and not (scope["path"] in OWN_ROUTES and scope["method"] in ("GET", "HEAD"))):
            response = await self.proxy.handle(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def create_app(pool: BackendPool, policy: Policy, metrics: RouterMetrics,
               transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout = httpx.Timeout(None),
               first_byte_timeout: float | None = None) -> RouterApp:
    # the replicas' /docs and /openapi.json are forwarded: the router has no API of its own to describe
    app = FastAPI(title="trtbuild route", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    proxy = Proxy(pool, policy, metrics, transport, timeout, first_byte_timeout)

    @app.get("/health")
    async def health() -> Response:
        healthy = [b.url for b in pool.backends if b.healthy]
        if not healthy:
            return no_backend("/health", 0)
        return JSONResponse({"status": "ok", "backends": {b.url: "healthy" if b.healthy else f"out: {b.reason}"
                                                          for b in pool.backends}})

    @app.get("/metrics")
    async def router_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    # RouterApp sends these methods to the proxy before FastAPI sees them; the route stays so that FastAPI
    # answers any other method with 405, as for a route that exists
    @app.api_route("/{path:path}", methods=FORWARDED_METHODS)
    async def forward(request: Request) -> Response:
        return await proxy.handle(request)

    return RouterApp(app, proxy)
