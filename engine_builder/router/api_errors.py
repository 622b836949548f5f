"""The router's own errors, in the shape each protocol's clients parse (the same shapes as `serve`'s
server/http_errors.py, restated here because the router imports nothing of the server):

    /v1/*        OpenAI: {"error": {"message", "type", "code", "param"}}
    other routes TGI:    {"error": "...", "error_type": "..."}
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse

NO_BACKEND_RETRY_AFTER_S = 1


def is_openai_route(path: str) -> bool:
    return path.startswith("/v1/")


def error_body(openai: bool, message: str, *, openai_code: str, tgi_type: str) -> dict[str, Any]:
    if openai:
        return {"error": {"message": message, "type": "server_error", "code": openai_code, "param": None}}
    return {"error": message, "error_type": tgi_type}


def no_backend(path: str, tried: int) -> JSONResponse:
    """503 (with Retry-After, as `serve` answers when it cannot generate): every backend is out or failed."""
    message = ("no healthy backend: " + (f"the {tried} tried failed before answering" if tried else
                                          "every replica is taken out (see the router's log and /metrics)")
               + "; retry shortly, and restart the replicas if it persists")
    return JSONResponse(error_body(is_openai_route(path), message, openai_code="unavailable", tgi_type="unhealthy"),
                        status_code=503, headers={"Retry-After": str(NO_BACKEND_RETRY_AFTER_S)})


def stream_cut_events(path: str, backend: str) -> bytes:
    """The events that end a stream whose backend died mid-stream: an error event (TGI: incomplete_generation,
    which huggingface_hub raises as IncompleteGenerationError), then [DONE] on OpenAI routes."""
    openai = is_openai_route(path)
    body = error_body(openai, f"the replica {backend} failed mid-stream; the output is incomplete, send the "
                              "request again", openai_code="backend_failed", tgi_type="incomplete_generation")
    out = f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
    return (out + "data: [DONE]\n\n" if openai else out).encode()
