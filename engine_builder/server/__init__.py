"""`trtbuild serve`: TGI- and OpenAI-compatible HTTP over the in-flight batching Executor.

    from engine_builder.server import serve
    serve("engine-dir", port=8000)          # blocks until SIGINT/SIGTERM

create_app (FastAPI, engine_builder.server.asgi_app) is the same server without uvicorn, for embedding.
"""

from engine_builder.server.config import ServerConfig
from engine_builder.server.http_server import serve

__all__ = ["ServerConfig", "serve"]
