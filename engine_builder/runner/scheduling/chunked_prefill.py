"""How a step's prompt-token budget is shared between the requests whose prompts are not yet in the cache.

    plan_chunks([(long_request, 1500), (short_request, 40)], budget=64, max_chunk=2048)
      -> [(short_request, 32), (long_request, 32)]

Why a budget: every prefill chunk runs in the same step as the batched decode, so the decoders'
inter-token gap is (decode time + the step's prefill time). Capping the prompt tokens per step while
others decode keeps that gap bounded: a 1,500-token prompt arriving beside 8 decoding streams is fed
a budget's worth per step instead of stalling them for its whole prefill. With nothing decoding,
there is nobody to stall, and the executor passes a budget as large as one engine call takes.

Why shares: oldest-first would give a long prompt the whole budget for many steps while a short one
that arrived a moment later waits for it (head-of-line blocking). Instead the budget is split
max-min fair within each priority level (lower priority values first): a short prompt takes what it
needs, the rest goes to the longer ones, so a short request's first token never waits for a long
prompt's whole prefill and the long one still progresses every step. A chunk is at least
`min_chunk` tokens (or what is left of its prompt): many tiny chunks would pay one engine call's
fixed cost each, so a sliver of budget too small for that waits for the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import TypeVar

from engine_builder.runner.tunables import MIN_CHUNK

T = TypeVar("T")



def plan_chunks(pending: Sequence[tuple[T, int, int]], budget: int, max_chunk: int,
                min_chunk: int = MIN_CHUNK) -> list[tuple[T, int]]:
    """pending: (request, priority, tokens left to prefill), in arrival order. Returns (request, tokens to feed
    now) within budget, each chunk at most max_chunk (the longest step the engine takes)."""
    plan: list[tuple[T, int]] = []
    remaining = budget
    by_priority = sorted(pending, key=lambda p: p[1])  # stable: arrival order within a level
    for _, level in groupby(by_priority, key=lambda p: p[1]):
        group = sorted(level, key=lambda p: p[2])  # smallest first: water-filling
        for i, (request, _, left) in enumerate(group):
            if remaining <= 0:
                return plan
            share = max(remaining // (len(group) - i), min_chunk)
            take = min(left, share, max_chunk, remaining)
            if take < min(left, min_chunk, budget):  # a sliver of budget left: not worth an engine call of its own
                return plan
            plan.append((request, take))
            remaining -= take
    return plan
