"""HTTP errors in the shape each protocol's clients parse.

    /v1/*        OpenAI: {"error": {"message", "type", "code", "param"}}  (the openai client raises
                 e.g. UnprocessableEntityError / RateLimitError / AuthenticationError from the status)
    other routes TGI:    {"error": "...", "error_type": "validation" | "overloaded" | ...}
                 (huggingface_hub maps error_type to ValidationError / OverloadedError ...)

Every error says what to do next, on one line, like the CLI's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine_builder.util.errors import CapacityError, TrtbuildError


@dataclass(frozen=True)
class ErrorKind:
    status: int
    tgi_type: str  # TGI's error_type
    openai_type: str  # OpenAI's error.type
    openai_code: str  # OpenAI's error.code


VALIDATION = ErrorKind(422, "validation", "invalid_request_error", "invalid_request")
OVERLOADED = ErrorKind(429, "overloaded", "rate_limit_error", "too_many_requests")
UNAUTHORIZED = ErrorKind(401, "authentication", "authentication_error", "invalid_api_key")
NOT_FOUND = ErrorKind(404, "not_found", "invalid_request_error", "not_found")
MODEL_NOT_FOUND = ErrorKind(404, "not_found", "invalid_request_error", "model_not_found")
GENERATION = ErrorKind(500, "generation", "server_error", "generation_failed")
UNAVAILABLE = ErrorKind(503, "unhealthy", "server_error", "unavailable")


class ApiError(Exception):
    def __init__(self, kind: ErrorKind, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.headers = kind, message, headers


def is_openai_route(path: str) -> bool:
    return path.startswith("/v1/")


def error_body(openai: bool, kind: ErrorKind, message: str) -> dict[str, Any]:
    """The JSON body of an error in OpenAI's or TGI's shape (also sent as an SSE event mid-stream)."""
    if openai:
        return {"error": {"message": message, "type": kind.openai_type, "code": kind.openai_code, "param": None}}
    return {"error": message, "error_type": kind.tgi_type}


def error_response(request: Request, kind: ErrorKind, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_body(is_openai_route(request.url.path), kind, message)
    return JSONResponse(body, status_code=kind.status, headers=headers)


def from_trtbuild_error(exc: TrtbuildError) -> ApiError:
    """The executor's user errors: a full queue is the server being busy (429, retry later); anything
    else (InputError, a request that cannot fit the engine) is the request's fault (422)."""
    if isinstance(exc, CapacityError):
        return ApiError(OVERLOADED, str(exc))
    return ApiError(VALIDATION, str(exc))


def validation_message(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: `parameters.temperature: Input should be a valid number; ...`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})")
        elif err.get("type") == "missing" and not loc:
            parts.append("the body is empty; send a JSON object")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) + ("; ..." if len(parts) > 5 else "") + " (see the API docs at /docs)"


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """JSON errors for every failure a request can meet; on_error(status) counts each (metrics)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        on_error(exc.kind.status)
        return error_response(request, exc.kind, exc.message, exc.headers)

    @app.exception_handler(TrtbuildError)
    async def trtbuild_error(request: Request, exc: TrtbuildError) -> JSONResponse:
        # SamplingParams and the tokenizer raise InputError for bad values: the request's fault
        err = from_trtbuild_error(exc)
        on_error(err.kind.status)
        return error_response(request, err.kind, err.message)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        on_error(VALIDATION.status)
        return error_response(request, VALIDATION, validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own 404 (unknown route) and 405 (wrong method), in the route's protocol shape
        on_error(exc.status_code)
        kind = NOT_FOUND if exc.status_code == 404 else ErrorKind(exc.status_code, "validation",
                                                                  "invalid_request_error", "invalid_request")
        message = (f"no route {request.method} {request.url.path}; see /docs for the endpoints"
                   if exc.status_code in (404, 405) else str(exc.detail))
        return error_response(request, kind, message, getattr(exc, "headers", None))
