"""HTTP errors in the shape each protocol's clients parse.

    /v1/*        OpenAI: {"error": {"message", "type", "code", "param"}}  (the openai client raises
                 e.g. UnprocessableEntityError / RateLimitError / AuthenticationError from the status)
    other routes TGI:    {"error": "...", "error_type": "validation" | "overloaded" | ...}
                 (huggingface_hub maps error_type to ValidationError / OverloadedError ...)

Every error says what to do next, on one line, like the CLI's, and never carries a traceback (an
unexpected exception is logged by the server and answered with a generic 500). Statuses: 401 no or
wrong key, 404 unknown model or route, 413 body over --max-request-bytes, 422 anything wrong with the
request itself (malformed or non-UTF-8 JSON, bad fields, limits) on the TGI routes and 400 for the same
on the OpenAI routes (/v1/*: what OpenAI and vLLM answer, and what the openai client raises as
BadRequestError; a field of the wrong type names the field in the message and in error.param), 429 over
--max-concurrent-requests, 500 generation failed, 503 the server cannot generate (stopped), 504 over
--request-timeout. 429 and 503 carry Retry-After.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from engine_builder.util.errors import CapacityError, TrtbuildError, UnsupportedError


@dataclass(frozen=True)
class ErrorKind:
    status: int
    tgi_type: str  # TGI's error_type
    openai_type: str  # OpenAI's error.type
    openai_code: str  # OpenAI's error.code


VALIDATION = ErrorKind(422, "validation", "invalid_request_error", "invalid_request")
# a well-formed request asking for something this server cannot do exactly (a JSON schema keyword the
# grammar engine cannot enforce): 400, as OpenAI and vLLM answer it
BAD_REQUEST = ErrorKind(400, "validation", "invalid_request_error", "unsupported")
OVERLOADED = ErrorKind(429, "overloaded", "rate_limit_error", "too_many_requests")
UNAUTHORIZED = ErrorKind(401, "authentication", "authentication_error", "invalid_api_key")
NOT_FOUND = ErrorKind(404, "not_found", "invalid_request_error", "not_found")
MODEL_NOT_FOUND = ErrorKind(404, "not_found", "invalid_request_error", "model_not_found")
TOO_LARGE = ErrorKind(413, "validation", "invalid_request_error", "request_too_large")
GENERATION = ErrorKind(500, "generation", "server_error", "generation_failed")
INTERNAL = ErrorKind(500, "generation", "server_error", "internal_error")
UNAVAILABLE = ErrorKind(503, "unhealthy", "server_error", "unavailable")
# huggingface_hub raises IncompleteGenerationError for TGI's "incomplete_generation"
TIMEOUT = ErrorKind(504, "incomplete_generation", "server_error", "request_timeout")
# nginx's "client closed request": the answer to a request whose client left (nobody reads it)
CLIENT_CLOSED = ErrorKind(499, "cancelled", "invalid_request_error", "client_closed_request")

# Retry-After (seconds) on the statuses a client should retry: busy (429) and stopped/stopping (503)
RETRY_AFTER_S = {OVERLOADED.status: 1, UNAVAILABLE.status: 5}


class ApiError(Exception):
    """rejected: a refusal before generation (counted in trtbuild_requests_rejected_total); False for
    the end of an admitted request, already counted by its finish reason."""

    def __init__(self, kind: ErrorKind, message: str, headers: dict[str, str] | None = None,
                 rejected: bool = True) -> None:
        super().__init__(message)
        self.kind, self.message, self.headers, self.rejected = kind, message, headers, rejected


class RequestTooLarge(HTTPException):
    """Raised by the body limit from receive(): an HTTPException, because FastAPI turns any other
    exception met while reading the body into a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(TOO_LARGE.status, f"the request body is larger than {limit} bytes (max_request_bytes, "
                                           "--max-request-bytes); send a shorter prompt")


def is_openai_route(path: str) -> bool:
    return path.startswith("/v1/")


def for_route(openai: bool, kind: ErrorKind) -> ErrorKind:
    """The kind as a route's protocol answers it: a bad request is TGI's 422 but OpenAI's 400."""
    if openai and kind.status == VALIDATION.status:
        return ErrorKind(400, kind.tgi_type, kind.openai_type, kind.openai_code)
    return kind


def error_body(openai: bool, kind: ErrorKind, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error in OpenAI's or TGI's shape (also sent as an SSE event mid-stream)."""
    if openai:
        return {"error": {"message": message, "type": kind.openai_type, "code": kind.openai_code, "param": param}}
    return {"error": message, "error_type": kind.tgi_type}


def error_response(request: Request, kind: ErrorKind, message: str,
                   headers: dict[str, str] | None = None, param: str | None = None) -> JSONResponse:
    openai = is_openai_route(request.url.path)
    kind = for_route(openai, kind)
    body = error_body(openai, kind, message, param)
    return JSONResponse(body, status_code=kind.status, headers=with_retry_after(kind, headers))


def with_retry_after(kind: ErrorKind, headers: dict[str, str] | None) -> dict[str, str] | None:
    if kind.status not in RETRY_AFTER_S or (headers and "Retry-After" in headers):
        return headers
    return {**(headers or {}), "Retry-After": str(RETRY_AFTER_S[kind.status])}


def body_parse_message(exc: BaseException | None) -> str:
    """Why FastAPI could not parse a body it reports only as "There was an error parsing the body"
    (a 400 that our API documents as 422): the cause it chained."""
    if isinstance(exc, UnicodeDecodeError):
        return (f"the body is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                "send JSON encoded as UTF-8")
    if isinstance(exc, RecursionError):
        return "the body's JSON is nested too deeply; send a flat JSON object"
    return "the body could not be parsed as JSON; send one JSON object encoded as UTF-8"


def from_trtbuild_error(exc: TrtbuildError) -> ApiError:
    """The executor's user errors: a full queue is the server being busy (429, retry later); anything
    else (InputError, a request that cannot fit the engine) is the request's fault (422)."""
    if isinstance(exc, CapacityError):
        return ApiError(OVERLOADED, str(exc))
    if isinstance(exc, UnsupportedError):
        return ApiError(BAD_REQUEST, str(exc))
    return ApiError(VALIDATION, str(exc))


# pydantic names a union's members in an error's loc (`stop.list[function-after[...]]`, `stop.str`): not
# fields, so left out of the field path a client reads
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc if p != "body" and not (
        isinstance(p, str) and (p in _TYPE_TAGS or any(c in p for c in "[](), -"))))


def validation_param(exc: RequestValidationError) -> str | None:
    """The first bad field's path (`messages.0.role`), OpenAI's error.param; None for a bad body as a whole."""
    for err in exc.errors():
        loc = _field_path(err.get("loc", ()))
        if loc:
            return loc
    return None


def validation_message(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: `parameters.temperature: Input should be a valid number; ...`; the
    errors of one field (a union's members) joined with "or"."""
    parts = []
    for err in exc.errors():
        loc = _field_path(err.get("loc", ()))
        if loc and parts and parts[-1].startswith(f"{loc}: "):
            parts[-1] += f" or {err.get('msg', 'invalid')}"
            continue
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})")
        elif err.get("type") == "missing" and not loc:
            parts.append("the body is empty; send a JSON object")
        elif err.get("type") in ("model_type", "model_attributes_type", "dict_type") and not loc:
            parts.append("the body must be a JSON object, sent with Content-Type: application/json")
        else:
            parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts[:5]) + ("; ..." if len(parts) > 5 else "") + " (see the API docs at /docs)"


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """JSON errors for every failure a request can meet; on_error(status) counts each (metrics)."""

    def status(request: Request, kind: ErrorKind) -> int:  # what the client gets, and what is counted
        return for_route(is_openai_route(request.url.path), kind).status

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.rejected:
            on_error(status(request, exc.kind))
        return error_response(request, exc.kind, exc.message, exc.headers)

    @app.exception_handler(TrtbuildError)
    async def trtbuild_error(request: Request, exc: TrtbuildError) -> JSONResponse:
        # SamplingParams and the tokenizer raise InputError for bad values: the request's fault
        err = from_trtbuild_error(exc)
        on_error(status(request, err.kind))
        return error_response(request, err.kind, err.message)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        on_error(status(request, VALIDATION))
        return error_response(request, VALIDATION, validation_message(exc), param=validation_param(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own 404 (unknown route) and 405 (wrong method), the body limit's 413, and FastAPI's
        # 400 for a body it could not parse (a non-UTF-8 body, too deep JSON): 422 with the reason, as
        # for malformed JSON
        if exc.status_code == 400:
            on_error(status(request, VALIDATION))
            return error_response(request, VALIDATION, body_parse_message(exc.__cause__))
        on_error(exc.status_code)
        kind = {404: NOT_FOUND, 413: TOO_LARGE}.get(exc.status_code) or ErrorKind(
            exc.status_code, "validation", "invalid_request_error", "invalid_request")
        message = (f"no route {request.method} {request.url.path}; see /docs for the endpoints"
                   if exc.status_code in (404, 405) else str(exc.detail))
        return error_response(request, kind, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # a bug: the traceback goes to the server log (Starlette re-raises after this), never to the client
        on_error(INTERNAL.status)
        return error_response(request, INTERNAL, "internal server error (logged by the server); retry, and "
                                                 "report it if it persists")
