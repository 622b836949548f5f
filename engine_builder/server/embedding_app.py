"""The FastAPI app of `trtbuild serve` over an encoder engine: embeddings, and a clear refusal of generation.

    app = create_embedding_app(EmbeddingService(EmbeddingBatcher(Embeddings(engine_dir).embedder), config))

Routes: POST /v1/embeddings (OpenAI), POST /embed (TEI) from embeddings_api.py; GET /v1/models, /health,
/metrics (embedding_metrics.py).
The generation routes of a decoder server (/generate, /generate_stream, /, /v1/completions,
/v1/chat/completions) answer 400 saying this model computes embeddings only; the same limits
apply as on a generation server (API key, body size, concurrent requests).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from engine_builder.executor.embedding_batcher import EmbeddingBatcher
from engine_builder.server import embeddings_api
from engine_builder.server.auth import ApiKeyMiddleware
from engine_builder.server.body_limit import BodyLimitMiddleware
from engine_builder.server.config import ServerConfig
from engine_builder.server.embedding_metrics import embedding_metrics
from engine_builder.server.embeddings_api import UNSUPPORTED, EmbeddingService
from engine_builder.server.http_errors import UNAVAILABLE, ApiError, error_response, install_error_handlers
from engine_builder.server.metrics import CONTENT_TYPE
from engine_builder.server.unread_body import UnreadBodyMiddleware
from engine_builder.util.version import __version__

GENERATION_ROUTES = ("/generate", "/generate_stream", "/", "/v1/completions", "/v1/chat/completions")


def create_embedding_app(service: EmbeddingService) -> FastAPI:
    config = service.config
    app = FastAPI(title="trtbuild serve", version=__version__, redoc_url=None,
                  description=f"{config.model_name}: OpenAI-compatible (/v1/embeddings) and TEI (/embed) embeddings.")
    app.state.embeddings = service
    app.state.server = service  # serve()'s shutdown calls cancel_all on it
    app.state.started = int(time.time())
    install_error_handlers(app, on_error=lambda status: None)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes, on_reject=lambda status: None)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, on_reject=lambda status: None)
    app.add_middleware(UnreadBodyMiddleware)  # around every refusal sent before the body is read (unread_body.py)
    app.include_router(embeddings_api.router)

    async def refuse_generation(request: Request) -> Response:
        raise ApiError(UNSUPPORTED, f"{config.model_name} is an embedding model (an encoder engine): it does not "
                                    f"generate text; use POST /v1/embeddings or POST /embed")

    for path in GENERATION_ROUTES:
        app.add_api_route(path, refuse_generation, methods=["POST"], include_in_schema=False)

    @app.get("/health", tags=["operations"], summary="200 while the embedding batcher runs")
    async def health(request: Request) -> Response:
        if not service.batcher.alive:
            return error_response(request, UNAVAILABLE, "the embedding batcher has stopped (see the server log); "
                                                        "restart the server")
        return JSONResponse({"status": "ok", "model": config.model_name})

    exposition = embedding_metrics(service.batcher.stats, lambda: service.active)

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models", tags=["OpenAI"], summary="The model this server serves (OpenAI)")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": app.state.started,
                                            "owned_by": "trtbuild", "max_model_len": config.max_input_tokens}]}

    return app


@contextlib.contextmanager
def embedding_app(engine_dir: Path, config: ServerConfig, *, backend: str, threads: int | None,
                  log: Callable[[str], None] | None, verify: bool = True) -> Iterator[FastAPI]:
    """serve()'s app over encoder engine ENGINE_DIR; the batcher and the session are closed on exit."""
    from engine_builder.runner.embeddings import Embeddings

    with Embeddings(engine_dir, backend=backend, threads=threads, verify=verify) as model:
        batcher = EmbeddingBatcher(model.embedder, max_queue=config.max_concurrent_requests)
        try:
            if log is not None:
                log(f"{config.model_name}: embeddings, {model.backend_name} ({model.backend_reason}); "
                    f"{model.dimensions} dimensions, max batch {model.max_batch}, max input tokens "
                    f"{model.max_tokens}, max concurrent requests {config.max_concurrent_requests}"
                    f"{', API key required' if config.api_key else ''}")
            yield create_embedding_app(EmbeddingService(batcher, config))
        finally:
            batcher.shutdown(drain=False)
