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
cancelled, and EventStream closes the request). Either is counted as a disconnect, never as an error.

A constrained request (json_schema / regex / choice) that ends on a stop token is checked against its
grammar first (structured_output.grammar_verdict): an answer the grammar engine gave up on ends as an
error (400; a stream's error event), never as a "stop".

Every request has a deadline (--request-timeout from admission): past it the request is cancelled
(its KV slot freed) and ends like a failed one: 504, or the stream's timeout event. Every stream
ends with its protocol's terminal event (TGI: the event with generated_text, or an error event;
OpenAI: [DONE], after an error event when it failed), also when the server itself fails mid-stream.

Tokenization and the chat template run in a worker thread: a huge prompt never holds the event
loop, so /health and /metrics answer at once whatever the generation routes are doing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine_builder.executor import Executor, RequestHandle, TokenEvent
from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.grammar import Constraint
from engine_builder.runner.llm import RequestOutput
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.vision.image_prompts import ImagePrompts, image_prompts_for, placeholder_text
from engine_builder.server.access_log import track
from engine_builder.server.chat_tokens import ChatTokens
from engine_builder.server.client_share import ClientShare
from engine_builder.server.config import ServerConfig
from engine_builder.server.http_errors import (
    BAD_REQUEST,
    CLIENT_CLOSED,
    GENERATION,
    INTERNAL,
    OVERLOADED,
    TIMEOUT,
    UNAVAILABLE,
    VALIDATION,
    ApiError,
    ErrorKind,
    error_body,
    from_trtbuild_error,
)
from engine_builder.server.metrics import ServerMetrics
from engine_builder.server.structured_output import grammar_verdict
from engine_builder.util.errors import TrtbuildError

# How often a non-streaming request checks that its client is still connected: a disconnect frees
# the KV slot within this much time, at the cost of one receive() poll per interval.
DISCONNECT_POLL_S = 0.25

logger = logging.getLogger("trtbuild.server")
T = TypeVar("T")


@dataclass
class ServerState:
    """Shared by every route of one app (app.state.server). Mutated only on the event loop."""

    executor: Executor
    config: ServerConfig
    metrics: ServerMetrics = field(init=False)
    active: int = 0  # admitted generation requests not yet closed
    token_texts: TokenTexts = field(init=False)
    chat_tokens: ChatTokens = field(init=False)  # chat messages as text (chat_tokens.py)
    image_prompts: ImagePrompts | None = field(init=False, default=None)  # a vision-language engine's, on first use
    requests: set[ActiveRequest] = field(init=False, default_factory=set)  # the admitted ones, for shutdown
    client_share: ClientShare | None = field(init=False)  # per-client fairness (client_share.py); None: off

    def cancel_all(self) -> None:
        """End every admitted request as the server stops: each stream gets its terminal event."""
        for active in list(self.requests):
            active.cancel("shutdown")

    def __post_init__(self) -> None:
        share = 2 * self.executor.stats().max_batch if self.config.client_share is None else self.config.client_share
        self.client_share = ClientShare(share) if share else None
        self.metrics = ServerMetrics(self.executor, lambda: self.active,
                                     lambda: self.client_share.held if self.client_share else 0)
        self.token_texts = TokenTexts(self.executor.llm.tokenizer)
        self.executor.llm.generator.grammars.warm()  # before the server listens: see GrammarCompiler.warm
        self.chat_tokens = ChatTokens(self.executor.llm, self.config.parse_chat_special_tokens)


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


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a worker thread: tokenizing a large prompt (or a chat template) takes the event
    loop's time otherwise, and /health with it (HF fast tokenizers release the GIL)."""
    return await asyncio.to_thread(fn, *args)


def check_capacity(state: ServerState) -> None:
    """429 before any work on the request (tokenizing included) when the server is full."""
    limit = state.config.max_concurrent_requests
    if state.active >= limit:
        raise ApiError(OVERLOADED, f"the server is busy: {state.active} requests are active "
                                   f"(max_concurrent_requests {limit}); retry later")


def check_top_logprobs(config: ServerConfig, value: int | None, field: str) -> None:
    if value is not None and value > config.max_top_logprobs:
        raise ApiError(VALIDATION, f"{field} must be at most {config.max_top_logprobs} (max_top_logprobs, "
                                   f"--max-top-logprobs), got {value}")


def check_stop(config: ServerConfig, stop: str | Sequence[str] | None) -> None:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > config.max_stop_sequences:
        raise ApiError(VALIDATION, f"stop has {len(stops)} sequences but this server takes at most "
                                   f"{config.max_stop_sequences} (max_stop_sequences, --max-stop-sequences)")
    for s in stops:
        if len(s) > config.max_stop_sequence_chars:
            raise ApiError(VALIDATION, f"a stop sequence has {len(s)} characters but this server takes at most "
                                       f"{config.max_stop_sequence_chars} (max_stop_sequence_chars, "
                                       "--max-stop-sequence-chars)")


def clamp_top_k(state: ServerState, top_k: int | None) -> int | None:
    """top_k at or above the vocabulary is "off"; clamped, as a huge value (2**63) would fail the batched
    sampling step of every request decoded with it, not only its own."""
    return top_k if top_k is None else min(top_k, state.executor.llm.backend.vocab_size)


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
          new_tokens_field: str, image: ImagePrompt | None = None) -> ActiveRequest:
    """Check the server's limits, then hand the request to the executor (image: a prompt's images, whose ids
    prompt_ids are). Raises ApiError."""
    check_lengths(state.config, len(prompt_ids), params.max_new_tokens, new_tokens_field)
    check_capacity(state)  # again: other requests were admitted while this one was tokenized
    try:
        handle = state.executor.submit(prompt_ids, params, image)
    except TrtbuildError as exc:
        if not state.executor.alive:  # shut down or broken: not the request's fault (503, not 422)
            raise ApiError(UNAVAILABLE, f"{exc}; this server cannot generate any more, restart it") from None
        raise from_trtbuild_error(exc) from None
    state.active += 1
    active = ActiveRequest(state, handle)
    state.requests.add(active)
    track(active)  # its tokens in this HTTP request's access-log line (access_log.py)
    return active


class ActiveRequest:
    def __init__(self, state: ServerState, handle: RequestHandle) -> None:
        self.state, self.handle = state, handle
        self.finish_reason: str | None = None  # set by the final event: stop, length, cancelled, error, timeout
        self.error: str | None = None
        self.completion_tokens = 0
        self.cause: str | None = None  # why the server cancelled it: disconnect, timeout, shutdown; or grammar
        self.deadline = asyncio.get_running_loop().time() + state.config.request_timeout
        self._closed = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.handle.prompt_token_ids)

    def cancel(self, cause: str) -> None:
        self.cause = self.cause or cause
        self.handle.cancel()

    async def events(self) -> AsyncIterator[TokenEvent]:
        """The handle's events, ending at the request's deadline with a final "timeout" event (no token)."""
        loop = asyncio.get_running_loop()
        events = self.handle.aevents()
        params = self.handle.params
        answer: list[int] | None = [] if Constraint.of(params) is not None else None  # its tokens, to replay
        try:
            while True:
                try:
                    event = await asyncio.wait_for(anext(events), max(0.0, self.deadline - loop.time()))
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    self.cancel("timeout")  # the executor frees the slot at its next step
                    timeout = self.state.config.request_timeout
                    event = TokenEvent(None, "", None, True, "timeout",
                                       f"the request took longer than {timeout:g} s (request_timeout, "
                                       "--request-timeout) and was cancelled; ask for fewer tokens or retry later")
                if event.token_id is not None:
                    self.completion_tokens += 1
                    self.state.metrics.rate.add()
                    if answer is not None:
                        answer.append(event.token_id)
                if answer is not None and event.finish_reason == "stop" and event.token_id in self._eos_ids():
                    why = await grammar_verdict(self.state, params, answer[:-1])
                    if why is not None:
                        self.cause = "grammar"
                        event = TokenEvent(None, "", None, True, "error", why)
                if event.finished:
                    self.finish_reason, self.error = event.finish_reason, event.error
                yield event
                if event.finished:
                    return
        finally:
            await events.aclose()

    def _eos_ids(self) -> tuple[int, ...]:
        """The tokens that end an answer the grammar must have completed: EOS is all it allows then. A stop
        string or one of the request's stop_token_ids cuts the answer where the client asked: not checked."""
        return () if self.handle.params.ignore_eos else self.state.executor.llm.generator.eos_token_ids

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
                    self.cancel("disconnect")  # the final "cancelled" event then ends drain()
            task.result()
        finally:
            task.cancel()
            self.close()
        self.raise_if_failed()
        return self.handle.result()

    def raise_if_failed(self) -> None:
        """The request's end as an error response; rejected=False: close() counted it already."""
        kind, message = failure(self.finish_reason, self.error, self.cause)
        if kind is not None:
            raise ApiError(kind, message, rejected=False)

    def close(self, disconnected: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if disconnected:
            self.cause = self.cause or "disconnect"
        if self.finish_reason is None or not self.handle.finished:
            self.handle.cancel()
        self.state.active -= 1
        self.state.requests.discard(self)
        reason = self.finish_reason or "cancelled"
        self.state.metrics.observe_end(self.handle, reason, disconnected=self.cause == "disconnect")


def failure(finish_reason: str | None, error: str | None, cause: str | None) -> tuple[ErrorKind | None, str]:
    """How a request that did not finish normally is reported: (kind, message), or (None, "")."""
    if finish_reason == "timeout":
        return TIMEOUT, error or "the request timed out"
    if finish_reason == "error" and cause == "grammar":
        return BAD_REQUEST, f"{error}; simplify the schema (fewer anyOf branches or optional keys), or send none"
    if finish_reason == "error":
        return GENERATION, f"generation failed: {error}; retry, and report it if it persists"
    if finish_reason == "cancelled" or finish_reason is None:
        if cause == "disconnect":
            return CLIENT_CLOSED, "the client closed the connection; the request was cancelled"
        return UNAVAILABLE, "the request was cancelled (the server is shutting down); retry later"
    return None, ""


def sse(data: Mapping[str, Any] | str) -> str:
    """One server-sent event (`data: ...` and a blank line)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n"


def failed_sse(openai: bool, active: ActiveRequest) -> str:
    """The SSE error event that ends a stream whose request failed, timed out or was cancelled."""
    kind, message = failure(active.finish_reason, active.error, active.cause)
    return sse(error_body(openai, kind or GENERATION, message))


class EventStream(StreamingResponse):
    """An SSE response that always ends with its protocol's terminal event (`openai`: an error event
    and [DONE]; TGI: an error event) when its body fails, and closes its request however the response
    ends: finished, client gone (Starlette cancels the body on http.disconnect), or never started."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[str], on_close: Callable[[bool], None], openai: bool) -> None:
        # no-cache / no buffering: proxies must pass each token on as it is written
        super().__init__(self._guarded(body, openai), headers={"Cache-Control": "no-cache",
                                                                "X-Accel-Buffering": "no"})
        self._on_close = on_close
        self._ended = False  # the body ran to its end: the client got the terminal event

    async def _guarded(self, body: AsyncIterator[str], openai: bool) -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk.encode("utf-8")
        except Exception:  # a bug: logged with its traceback, the client gets one line and the terminal event
            logger.exception("a stream failed")
            yield sse(error_body(openai, INTERNAL, "internal server error (logged by the server); retry, and "
                                                   "report it if it persists")).encode()
            if openai:
                yield sse("[DONE]").encode()
        self._ended = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close(not self._ended)


async def with_images(state: ServerState, ids: list[int],
                      images: Sequence[str]) -> tuple[list[int], ImagePrompt | None]:
    """A prompt's images (data: URLs) decoded, encoded and spliced, off the event loop (runner/vision/): its
    expanded ids and the ImagePrompt to submit with them. Raises ApiError (400) for an image it cannot take."""
    if not images:
        return ids, None
    llm = state.executor.llm
    if llm.engine.model.vision is None:
        raise ApiError(VALIDATION, f"{state.config.model_name} is a text-only model and takes no images; send text "
                                   "content only")
    if state.image_prompts is None:
        state.image_prompts = image_prompts_for(llm.engine, llm.tokenizer, limits=state.config.image_limits)
    try:
        image = await off_loop(state.image_prompts.prepare, ids, list(images))
    except TrtbuildError as exc:
        raise from_trtbuild_error(exc) from None
    return image.ids, image


def image_token_text(state: ServerState) -> str | None:
    """The text of the token that marks an image (where an image content part goes), None without vision."""
    return placeholder_text(state.executor.llm.engine, state.executor.llm.tokenizer)
