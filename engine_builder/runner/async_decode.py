"""Async scheduling as the loop's decode policy: a step is launched before the last step's tokens reach the host
(vLLM v1's async scheduling, TensorRT-LLM's overlap scheduler). `LLM(..., async_scheduling=True)`,
`--async-scheduling`.

A plain decode step waits for its sampled tokens, then the host accepts them (stop checks, detokenizing, events)
and the scheduler plans the next step, while the GPU idles: SmolLM2's shape compiled on an H100 ran 1.35 ms of
kernels in 2.52 ms of step wall at batch 64 (benchmarks/results/gpu-step-profile-compiled-h100-2026-12-05.*).
Here each call launches its step first, the input ids of requests already decoding taken from the last step's
samples where they are, on the device (ModelInput.device_tokens), and only then waits for the last step's tokens
and accepts them: the host's work runs while the GPU computes the step just launched.

    the KV           a step writes its position whatever token comes out, so the KV length advances at launch;
                     the scheduler, which plans from KV lengths and accepted tokens, then asks for the blocks the
                     next step writes, as after a plain step
    one step late    a request's tokens are accepted one call after they were sampled, so a finished request (EOS,
                     a stop string, max_new_tokens) is found out after one more step was launched for it: that
                     row's token is dropped, and the position it wrote lies within the request's reservation
    the same tokens  greedy and seeded requests get PlainDecode's tokens: each step's inputs are the same, and a
                     sampling row draws one uniform a step from its own generator (unseeded rows share the
                     sampler's, which a dropped row also draws from)
    falls back       a step with a row the device cannot sample alone (beams; a grammar or penalties, which read
                     the tokens just accepted; logprobs) waits for the step in flight first, then runs plainly, as
                     a longrope model's steps do (its re-prefill rewrites the KV at a length)
    preemption       a request preempted with a token in flight loses it and samples it again when recomputed:
                     the same token when greedy, a new draw when sampling
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_builder.runner.core.model_input import DeviceTokens, ModelInput
from engine_builder.runner.generate import Generator, drop_finished
from engine_builder.runner.request_state import Event, RequestState, StepClock


@dataclass
class _InFlight:
    """A launched step: its requests in row order, their samples on the way (a DeviceSample: `tokens` on the
    device, token_ids() on the host), and the requests that left the loop since (their rows are dropped)."""

    requests: list[RequestState]
    sample: Any
    dropped: set[int] = field(default_factory=set)  # request ids

    def row_of(self) -> dict[int, int]:
        return {r.index: i for i, r in enumerate(self.requests) if r.index not in self.dropped}


class AsyncDecode:
    """The DecodePolicy that launches step N+1 before accepting step N's tokens (module doc)."""

    step_tokens = 1

    def __init__(self) -> None:
        self._flight: _InFlight | None = None
        self.ahead_steps = 0  # steps that took input ids still on the device (launched before the last was accepted)

    def begin(self) -> None:
        self._flight = None

    def decode(self, gen: Generator, active: dict[int, RequestState], events: list[Event],
               clock: StepClock | None) -> None:
        if gen.backend.reprefill_after is not None or not all(_overlaps(r) for r in active.values()):
            waited = time.perf_counter()
            accepted = self._accept(gen, self._flight, events)
            self._flight = None
            drop_finished(active)
            if clock is not None and accepted:  # the step in flight was counted when it was launched
                clock.decode_step(time.perf_counter() - waited, 0.0, accepted, steps=0)
            if active:
                gen.decode_batch(active, events, clock)
            return
        started = time.perf_counter()
        execute_before = gen.backend.execute_seconds
        slots = sorted(active)
        rows = [active[s] for s in slots]
        at = np.asarray(slots, np.int64)
        kv = gen.backend.kv
        taken = self._taken(rows)
        self.ahead_steps += taken is not None
        logits = gen.run_step(ModelInput.decode(at, gen.next_ids[at, 0], kv.lengths[at], taken))
        sample = gen.sampler.launch(logits, [r.sampling for r in rows])
        for s in slots:
            kv.advance(s, 1)
        last, self._flight = self._flight, _InFlight(rows, sample)
        accepted = self._accept(gen, last, events)  # while the GPU runs the step just launched
        drop_finished(active)
        if clock is not None:
            clock.decode_step(time.perf_counter() - started, gen.backend.execute_seconds - execute_before, accepted)

    def _taken(self, rows: list[RequestState]) -> DeviceTokens | None:
        """Where the rows' input ids are the step in flight's samples, not yet on the host."""
        if self._flight is None:
            return None
        row_of = self._flight.row_of()
        pairs = [(i, row_of[r.index]) for i, r in enumerate(rows) if r.index in row_of]
        if not pairs:
            return None
        taken = np.asarray(pairs, np.int64)
        return DeviceTokens(taken[:, 0], self._flight.sample.tokens, taken[:, 1])

    def _accept(self, gen: Generator, flight: _InFlight | None, events: list[Event]) -> int:
        """Wait for FLIGHT's tokens and accept those of requests still in the loop; how many were accepted."""
        if flight is None:
            return 0
        tokens = flight.sample.token_ids()
        accepted = 0
        for r, token in zip(flight.requests, tokens):
            if r.index not in flight.dropped and not r.finished and r.slot is not None:
                gen.accept(r, int(token), None, events)
                accepted += 1
        return accepted

    def release(self, r: RequestState) -> None:
        """r left the loop (finished, cancelled, preempted): its row of the step in flight is dropped."""
        if self._flight is not None:
            self._flight.dropped.add(r.index)

    def close(self) -> None:
        self._flight = None


def _overlaps(r: RequestState) -> bool:
    """Can r's next token be sampled on the device with nothing from the host but what it had a step ago?"""
    s = r.sampling
    return (r.beams is None and s.grammar is None and s.seen is None and s.counts is None
            and r.params.logprobs is None)

