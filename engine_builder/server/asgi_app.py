"""The FastAPI app of `trtbuild serve`: TGI and OpenAI routes over one Executor, plus operations.

    app = create_app(Executor(LLM("engine-dir")), ServerConfig.for_engine(limits, "smollm2"))

Routes: POST /generate, /generate_stream, / (TGI); POST /v1/completions, /v1/chat/completions,
GET /v1/models (OpenAI); GET /health, /metrics (Prometheus text); GET /docs (OpenAPI).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from engine_builder.executor import Executor
from engine_builder.server import embeddings_api, openai_api, tgi, tokenize_api
from engine_builder.server.access_log import AccessLogMiddleware, LogFormat
from engine_builder.server.auth import ApiKeyMiddleware
from engine_builder.server.body_limit import BodyLimitMiddleware
from engine_builder.server.client_limit import ClientLimitMiddleware
from engine_builder.server.client_share import ClientShareMiddleware
from engine_builder.server.config import ServerConfig
from engine_builder.server.generation import ServerState
from engine_builder.server.http_errors import UNAVAILABLE, error_response, install_error_handlers
from engine_builder.server.metrics import CONTENT_TYPE
from engine_builder.server.stalled_clients import StalledClientMiddleware
from engine_builder.server.unread_body import UnreadBodyMiddleware
from engine_builder.util.version import __version__


def create_app(executor: Executor, config: ServerConfig, access_log: Callable[[str], None] | None = None,
               log_format: LogFormat = "text") -> FastAPI:
    app = FastAPI(title="trtbuild serve", version=__version__, redoc_url=None,
                  description=f"{config.model_name}: TGI (/generate, /generate_stream) and OpenAI-compatible "
                              "(/v1/completions, /v1/chat/completions) text generation.")
    state = ServerState(executor, config)
    app.state.server = state
    app.state.started = int(time.time())

    def count_rejected(status: int) -> None:
        state.metrics.rejected.labels(str(status)).inc()

    install_error_handlers(app, on_error=count_rejected)
    # outermost last: the key is checked first, then the client's requests in flight (the hard limit, then its
    # share: client_share.py), then the body's size, before anything reads it
    app.add_middleware(StalledClientMiddleware, timeout=config.stalled_stream_timeout)  # innermost: around sends
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes, on_reject=count_rejected)
    if state.client_share is not None:  # inside the hard limit below: a request it refuses is never held
        app.add_middleware(ClientShareMiddleware, door=state.client_share, on_reject=count_rejected,
                           room=lambda: config.max_concurrent_requests - state.active)
    if config.max_concurrent_per_client is not None:
        app.add_middleware(ClientLimitMiddleware, limit=config.max_concurrent_per_client, on_reject=count_rejected)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, on_reject=count_rejected)
    app.add_middleware(UnreadBodyMiddleware)  # around every refusal sent before the body is read (unread_body.py)
    if access_log is not None:  # outermost: refusals are logged too, streams timed to their last byte
        app.add_middleware(AccessLogMiddleware, write=access_log, fmt=log_format)
    app.include_router(tgi.router)
    app.include_router(openai_api.router)
    app.include_router(embeddings_api.router)  # answers 400 here: a generation engine has no embeddings
    app.include_router(tokenize_api.router)

    @app.get("/health", tags=["operations"], summary="200 while the executor runs")
    async def health(request: Request) -> Response:
        if not executor.alive:
            return error_response(request, UNAVAILABLE, "the executor has stopped (see the server log); restart "
                                                        "the server")
        return JSONResponse({"status": "ok", "model": config.model_name})

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    return app
