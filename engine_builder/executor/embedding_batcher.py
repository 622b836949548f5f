"""Batching of concurrent embedding requests over one Embedder, in a thread of its own.

    batcher = EmbeddingBatcher(embedder)
    future = batcher.submit([[101, 7592, 102], [101, 2088, 102]])    # token ids of two texts
    vectors = future.result()                                       # float32 [2, hidden]
    batcher.shutdown()

Each step takes every waiting request, up to max_batch texts (at least one request, however large),
and runs them as one Embedder call: requests that arrive while the engine runs wait for the next
step and are batched together, so many small concurrent requests cost one engine call per step
rather than one each. The Embedder sorts a step's texts by length and splits them into engine
batches of max_batch rows. An exception fails the requests of that step only; the loop goes on.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine_builder.util.errors import CapacityError, InputError

if TYPE_CHECKING:
    import numpy as np

    from engine_builder.runner.embedder import Embedder


@dataclass(frozen=True)
class EmbeddingStats:
    queue_depth: int  # requests waiting
    requests_finished: int
    requests_failed: int
    texts: int  # embedded so far
    steps: int  # engine calls (each over one or more requests)


@dataclass
class _Request:
    token_ids: list[list[int]]
    future: Future


class EmbeddingBatcher:
    def __init__(self, embedder: Embedder, max_queue: int = 256) -> None:
        self.embedder = embedder
        self.max_queue = max_queue
        self._lock = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._accepting = True
        self._finished = self._failed = self._texts = self._steps = 0
        self._thread = threading.Thread(target=self._run, name="trtbuild-embedder", daemon=True)
        self._thread.start()

    def submit(self, token_ids: Sequence[Sequence[int]]) -> Future:
        """Queue one request (token ids of its texts); its future gets float32 [texts, hidden]. Raises here
        CapacityError when max_queue requests already wait, InputError after shutdown or for no texts."""
        if not token_ids:
            raise InputError("no texts given; pass at least one")
        future: Future = Future()
        with self._lock:
            if not self._accepting:
                raise InputError("the embedding batcher is shut down")
            if len(self._waiting) >= self.max_queue:
                raise CapacityError(f"{len(self._waiting)} embedding requests are already waiting (max_queue "
                                    f"{self.max_queue}); retry later")
            self._waiting.append(_Request([list(ids) for ids in token_ids], future))
            self._lock.notify_all()
        return future

    def stats(self) -> EmbeddingStats:
        with self._lock:
            return EmbeddingStats(len(self._waiting), self._finished, self._failed, self._texts, self._steps)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, drain: bool = True) -> None:
        """Stop accepting; drain finishes the queued requests, else they fail at once. Idempotent."""
        with self._lock:
            self._accepting = False
            if not drain:
                while self._waiting:
                    self._waiting.popleft().future.set_exception(InputError("the server is shutting down"))
            self._lock.notify_all()
        self._thread.join()

    def _take(self) -> list[_Request] | None:
        """The next step's requests, None once shut down with nothing left."""
        with self._lock:
            while not self._waiting and self._accepting:
                self._lock.wait()
            if not self._waiting:
                return None
            step = [self._waiting.popleft()]
            rows = len(step[0].token_ids)
            while self._waiting and rows + len(self._waiting[0].token_ids) <= self.embedder.max_batch:
                rows += len(self._waiting[0].token_ids)
                step.append(self._waiting.popleft())
            return step

    def _run(self) -> None:
        while (step := self._take()) is not None:
            step = [r for r in step if r.future.set_running_or_notify_cancel()]
            if not step:
                continue
            rows = [ids for r in step for ids in r.token_ids]
            try:
                vectors: np.ndarray = self.embedder.embed_ids(rows).embeddings
            except Exception as exc:  # noqa: BLE001  (the requests of this step fail; the loop goes on)
                for r in step:
                    r.future.set_exception(exc)
                with self._lock:
                    self._failed += len(step)
                continue
            start = 0
            for r in step:
                r.future.set_result(vectors[start:start + len(r.token_ids)])
                start += len(r.token_ids)
            with self._lock:
                self._finished += len(step)
                self._texts += len(rows)
                self._steps += 1
