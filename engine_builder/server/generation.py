"""What every generation route shares: length checks, admission, the executor hand-off, and the end
of a request (normal, client gone, server stopping).

    route handler   parse + validate the protocol's JSON, tokenize, build SamplingParams
    admit()         the server's limits (max_input_tokens, max_total_tokens, max_concurrent_requests),
                    then Executor.submit (the executor's own checks raise in this thread)
    ActiveRequest   relays the handle's TokenEvents; close() cancels an unfinished request (its KV
                    slot is freed at the executor's next step), frees its admission and records
                    its metrics, exactly once, however the request ends

A non-streaming request watches for its client leaving (request.is_disconnected) and cancels;
a streaming one is cancelled by Starlette when the client disconnects (the response task is
cancelled, and EventStream closes the request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine_builder.executor import Executor, RequestHandle, TokenEvent
from engine_builder.runner.llm import RequestOutput
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.server.config import ServerConfig
from engine_builder.server.http_errors import (
    GENERATION,
    OVERLOADED,
    UNAVAILABLE,
    VALIDATION,
    ApiError,
    error_body,
    from_trtbuild_error,
)
from engine_builder.server.metrics import ServerMetrics
from engine_builder.util.errors import TrtbuildError

# How often a non-streaming request checks that its client is still connected: a disconnect frees
# the KV slot within this much time, at the cost of one receive() poll per interval.
DISCONNECT_POLL_S = 0.25


@dataclass
class ServerState:
    """Shared by every route of one app (app.state.server). Mutated only on the event loop."""

    executor: Executor
    config: ServerConfig
    metrics: ServerMetrics = field(init=False)
    active: int = 0  # admitted generation requests not yet closed
    token_texts: TokenTexts = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.executor, lambda: self.active)
        self.token_texts = TokenTexts(self.executor.llm.tokenizer)


class TokenTexts:
    """The text of single tokens, for logprobs and TGI's token details (special tokens kept, as TGI
    and OpenAI show them); cached, since a server decodes the same few thousand ids again and again."""

    def __init__(self, tokenizer: Any) -> None:
        self._decode = getattr(tokenizer, "backend_tokenizer", tokenizer).decode
        self.special_ids = frozenset(int(t) for t in tokenizer.all_special_ids)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._decode([token_id], skip_special_tokens=False)
        return text


def server_state(request: Request) -> ServerState:
    """FastAPI dependency: the state create_app put on the app."""
    return request.app.state.server


def max_new_tokens(state: ServerState, prompt_len: int, requested: int | None, default: int | None,
                   field: str) -> int:
    """The request's value (named `field` in errors), else `default` (None = all the room
    max_total_tokens leaves), never more than that room: a default must not turn a valid prompt
    into a 422."""
    if requested is not None:
        if requested < 1:
            raise ApiError(VALIDATION, f"{field} must be >= 1, got {requested}")
        return requested
    room = state.config.max_total_tokens - prompt_len
    return max(1, room if default is None else min(default, room))


def check_lengths(config: ServerConfig, prompt_len: int, new_tokens: int, new_tokens_field: str) -> None:
    if prompt_len == 0:
        raise ApiError(VALIDATION, "the prompt is empty; give at least one token of text")
    if prompt_len > config.max_input_tokens:
        raise ApiError(VALIDATION, f"the prompt has {prompt_len} tokens but this server takes at most "
                                   f"{config.max_input_tokens} (max_input_tokens); shorten the prompt")
    if prompt_len + new_tokens > config.max_total_tokens:
        raise ApiError(VALIDATION, f"prompt {prompt_len} tokens + {new_tokens_field} {new_tokens} = "
                                   f"{prompt_len + new_tokens} exceeds max_total_tokens {config.max_total_tokens}; "
                                   f"ask for at most {config.max_total_tokens - prompt_len} new tokens")


def admit(state: ServerState, prompt_ids: Sequence[int], params: SamplingParams,
          new_tokens_field: str) -> ActiveRequest:
    """Check the server's limits, then hand the request to the executor. Raises ApiError."""
    check_lengths(state.config, len(prompt_ids), params.max_new_tokens, new_tokens_field)
    limit = state.config.max_concurrent_requests
    if state.active >= limit:
        raise ApiError(OVERLOADED, f"the server is busy: {state.active} requests are active "
                                   f"(max_concurrent_requests {limit}); retry later")
    try:
        handle = state.executor.submit(prompt_ids, params)
    except TrtbuildError as exc:
        if not state.executor.alive:  # shut down or broken: not the request's fault (503, not 422)
            raise ApiError(UNAVAILABLE, f"{exc}; this server cannot generate any more, restart it") from None
        raise from_trtbuild_error(exc) from None
    state.active += 1
    return ActiveRequest(state, handle)


class ActiveRequest:
    def __init__(self, state: ServerState, handle: RequestHandle) -> None:
        self.state, self.handle = state, handle
        self.finish_reason: str | None = None  # set by the final event
        self.error: str | None = None
        self.completion_tokens = 0
        self._closed = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.handle.prompt_token_ids)

    async def events(self) -> AsyncIterator[TokenEvent]:
        async for event in self.handle.aevents():
            if event.token_id is not None:
                self.completion_tokens += 1
                self.state.metrics.rate.add()
            if event.finished:
                self.finish_reason, self.error = event.finish_reason, event.error
            yield event

    async def output(self, request: Request) -> RequestOutput:
        """Wait for the end (non-streaming); cancel if the client goes away meanwhile."""
        async def drain() -> None:
            async for _ in self.events():
                pass

        task = asyncio.ensure_future(drain())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    self.handle.cancel()  # the final "cancelled" event then ends drain()
            task.result()
        finally:
            task.cancel()
            self.close()
        self.raise_if_failed()
        return self.handle.result()

    def raise_if_failed(self) -> None:
        if self.finish_reason == "error":
            raise ApiError(GENERATION, f"generation failed: {self.error}; retry, and report it if it persists")
        if self.finish_reason == "cancelled":
            raise ApiError(UNAVAILABLE, "the request was cancelled (the server is shutting down); retry later")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.finish_reason is None:
            self.handle.cancel()
        self.state.active -= 1
        self.state.metrics.observe_end(self.handle, self.finish_reason or "cancelled")


def sse(data: Mapping[str, Any] | str) -> str:
    """One server-sent event (`data: ...` and a blank line)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


def failed_sse(openai: bool, error: str | None) -> str:
    """The SSE error event that ends a stream whose request failed (ERROR) or was cancelled (None)."""
    message = error or "the request was cancelled (the server is shutting down)"
    return sse(error_body(openai, GENERATION, f"generation failed: {message}"))


class EventStream(StreamingResponse):
    """An SSE response that closes its request however the response ends: finished, client gone
    (Starlette cancels the body on http.disconnect), or never started at all."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        # no-cache / no buffering: proxies must pass each token on as it is written
        super().__init__(body, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
