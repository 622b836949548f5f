"""The router's FastAPI app: its own /health and /metrics; every other route is forwarded to a replica.

    app = create_app(pool, make_policy("prefix-aware"), metrics, httpx.AsyncClient())

Forwarded: POST /generate, /generate_stream, / (TGI); POST /v1/completions, /v1/chat/completions,
GET /v1/models (OpenAI); and whatever else `serve` answers (/docs, /openapi.json), unknown routes
included (the replica's 404, in its API's shape).
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from engine_builder.router.api_errors import no_backend
from engine_builder.router.backends import BackendPool
from engine_builder.router.policies import Policy
from engine_builder.router.proxy import Proxy
from engine_builder.router.router_metrics import CONTENT_TYPE, RouterMetrics
from engine_builder.util.version import __version__

FORWARDED_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


def create_app(pool: BackendPool, policy: Policy, metrics: RouterMetrics, client: httpx.AsyncClient) -> FastAPI:
    # the replicas' /docs and /openapi.json are forwarded: the router has no API of its own to describe
    app = FastAPI(title="trtbuild route", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    proxy = Proxy(pool, policy, metrics, client)

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

    @app.api_route("/{path:path}", methods=FORWARDED_METHODS)
    async def forward(request: Request) -> Response:
        return await proxy.handle(request)

    return app
