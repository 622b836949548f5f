"""One submitted request as its client sees it: a stream of TokenEvents, cancel(), the final result.

The executor thread appends events; any number of consumers read them, each from the start:
`events()` from threads (blocking, on a Condition), `aevents()` from asyncio. An async consumer
registers an asyncio.Queue on its own running loop and replays the events so far; later events
reach it through loop.call_soon_threadsafe. Replay and registration happen under the same lock
as the append, so an event is delivered exactly once to each consumer, in order, however late it
subscribes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from engine_builder.runner.outputs import RequestOutput
from engine_builder.runner.sampler import TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenEvent:
    token_id: int | None  # None only on a final event that carries no new token (cancel, error)
    text: str  # new detokenized text safe to show (may be "")
    logprob: TokenLogprobs | None  # when params.logprobs is set
    finished: bool
    finish_reason: str | None  # final event: "stop" | "length" | "cancelled" | "error"
    error: str | None = None  # message when finish_reason == "error"


class RequestFailed(RuntimeError):
    """The executor failed this request (an engine or loop error, not the client's input)."""


class RequestHandle:
    """A submitted request. Created by Executor.submit; the executor thread calls _emit."""

    def __init__(self, request_id: int, prompt_token_ids: tuple[int, ...], params: SamplingParams,
                 on_cancel: Callable[[RequestHandle], None]) -> None:
        self.id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.token_times: list[float] = []  # time.monotonic() of each generated token's event
        self._on_cancel = on_cancel
        self._cond = threading.Condition()
        self._events: list[TokenEvent] = []
        self._subscribers: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenEvent]]] = []
        self._stop_reason: int | str | None = None
        self.prompt_logprobs: list | None = None  # the request state's list (params.prompt_logprobs)

    @property
    def finished(self) -> bool:
        with self._cond:
            return bool(self._events) and self._events[-1].finished

    def cancel(self) -> None:
        """Stop generating; the executor frees the KV slot at the next step boundary and ends the
        stream with finish_reason "cancelled". Idempotent; a no-op once finished."""
        if not self.finished:
            self._on_cancel(self)

    def events(self, timeout: float | None = None) -> Iterator[TokenEvent]:
        """Every event of this request, from the first, blocking for new ones; ends after the final
        event. timeout: the longest wait for any one event (then TimeoutError)."""
        seen = 0
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda n=seen: len(self._events) > n, timeout):
                    raise TimeoutError(f"request {self.id}: no event within {timeout} s")
                new = self._events[seen:]
            for event in new:
                seen += 1
                yield event
                if event.finished:
                    return

    async def aevents(self) -> AsyncIterator[TokenEvent]:
        """events() for asyncio: binds to the running loop on the first iteration; nothing before
        that is lost (the events so far are replayed)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        subscriber = (loop, queue)
        with self._cond:
            for event in self._events:
                queue.put_nowait(event)
            self._subscribers.append(subscriber)
        try:
            while True:
                event = await queue.get()
                yield event
                if event.finished:
                    return
        finally:
            with self._cond:
                self._subscribers.remove(subscriber)

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until finished: the output, as LLM.generate returns it (finish_reason "cancelled" with
        what was generated before a cancel). Raises RequestFailed if the executor failed it."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._events) and self._events[-1].finished, timeout):
                raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
            events = list(self._events)
        final = events[-1]
        if final.finish_reason == "error":
            raise RequestFailed(f"request {self.id} failed: {final.error}")
        tokens = [e for e in events if e.token_id is not None]
        return RequestOutput(None, self.prompt_token_ids, "".join(e.text for e in events),
                             tuple(e.token_id for e in tokens), final.finish_reason, self._stop_reason,
                             tuple(e.logprob for e in tokens) if self.params.logprobs is not None else None,
                             tuple(self.prompt_logprobs) if self.prompt_logprobs is not None else None)

    # --- the executor thread's side -------------------------------------------------------------

    def _emit(self, event: TokenEvent, stop_reason: int | str | None = None) -> None:
        if event.token_id is not None:
            now = time.monotonic()
            self.token_times.append(now)
            if self.first_token_time is None:
                self.first_token_time = now
        with self._cond:
            if event.finished:
                self._stop_reason = stop_reason
            self._events.append(event)
            self._cond.notify_all()
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, event)
            except RuntimeError:  # that loop is closed: its consumer is gone
                pass
