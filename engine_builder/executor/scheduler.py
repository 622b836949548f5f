"""The executor's scheduling policy: who gets a KV slot, and how many prompt tokens run per step.

    admit     first come, first served: the oldest waiting request takes a slot while one is free,
              fewer than max_batch run, and its reservation fits (KVCacheManager.allocate reserves
              prompt + max_new_tokens <= max_seq up front, so an admitted request never runs out
              of cache; submit already refused requests that could never fit). A request that
              cannot be admitted blocks the ones behind it: no overtaking, so none starves.
    prefill   admitted requests whose prompts are not fully in the cache share a budget of
              max_tokens_per_step prompt tokens per step, oldest first; a longer prompt continues
              next step where it stopped (chunked prefill). The budget counts prompt tokens only:
              every running decode gets its token each step whatever the prompts, so a long prompt
              delays the others by at most one budget's worth of engine time per step.
    decode    every admitted request past its prefill feeds its last token in one batched call.

Per-slot state lives in the Generator's step functions (engine_builder/runner/generate.py); this
class only orders the requests. It belongs to the executor thread, except `waiting`, which
Executor.submit appends to under the executor's lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine_builder.runner.generate import Generator
from engine_builder.runner.request_state import RequestState
from engine_builder.util.errors import ConfigError


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int | None = None  # concurrent sequences; None = the engine's KV slots (its max_batch); must be <= that
    max_tokens_per_step: int = 512  # prefill token budget per step (chunked prefill); running decodes always get theirs
    max_queue: int = 256  # waiting requests beyond which submit() raises CapacityError (a server answers 429)

    def __post_init__(self) -> None:
        for name, low in (("max_batch", 1), ("max_tokens_per_step", 1), ("max_queue", 0)):
            value = getattr(self, name)
            if value is None and name == "max_batch":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"SchedulerConfig.{name} must be an integer >= {low}, got {value!r}")

    def batch_for(self, kv_slots: int) -> int:
        """max_batch on an engine with kv_slots KV cache slots."""
        if self.max_batch is None:
            return kv_slots
        if self.max_batch > kv_slots:
            raise ConfigError(f"max_batch {self.max_batch} exceeds the engine's {kv_slots} KV cache slots "
                              f"(its max_batch); use max_batch {kv_slots} or less, or rebuild with a larger max_batch")
        return self.max_batch


class Scheduler:
    def __init__(self, config: SchedulerConfig, generator: Generator) -> None:
        self.config = config
        self.generator = generator
        self.max_batch = config.batch_for(generator.backend.kv.batch_slots)
        self.waiting: deque[RequestState] = deque()  # submitted, no slot yet; FCFS
        self.running: dict[int, RequestState] = {}  # request id -> state, in admission order

    def admit(self) -> None:
        kv = self.generator.backend.kv
        while self.waiting and len(self.running) < self.max_batch and kv.num_free:
            r = self.waiting.popleft()
            self.generator.admit(r)
            self.running[r.index] = r

    def prefill_plan(self) -> list[tuple[RequestState, int]]:
        """(request, prompt tokens to feed now) within this step's budget, oldest first."""
        budget, plan = self.config.max_tokens_per_step, []
        for r in self.running.values():
            left = self.generator.prefill_remaining(r)
            if left and budget:
                plan.append((r, min(left, budget)))
                budget -= plan[-1][1]
        return plan

    def decoding(self) -> dict[int, RequestState]:
        """slot -> request for every running request past its prefill (the decode step's rows)."""
        return {r.slot: r for r in self.running.values() if r.token_ids and r.slot is not None}

    def remove(self, ids: Iterable[int]) -> list[RequestState]:
        """Take these requests out of the queue and the running set (cancel, failure); slots are
        the caller's to release. Unknown ids (already finished) are ignored."""
        ids = set(ids)
        out = [r for r in self.waiting if r.index in ids]
        if out:
            self.waiting = deque(r for r in self.waiting if r.index not in ids)
        out += [self.running.pop(i) for i in ids if i in self.running]
        return out

    def retire_finished(self) -> list[RequestState]:
        """Drop finished requests from the running set (their slots were freed when they finished)."""
        done = [r for r in self.running.values() if r.finished]
        for r in done:
            del self.running[r.index]
        return done

    @property
    def all_ids(self) -> list[int]:
        return [r.index for r in self.waiting] + list(self.running)
