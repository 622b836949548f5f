"""Which of a step's prefill chunks share one engine call (runner/batched_prefill.py), and what a call costs.

    groups = PrefillGroups()
    for group in groups.plan(generator, sched.prefill_plan()):   # [[(r, n)], [(r1, n1), (r2, n2)], ...]
        ...one call per group...; groups.observe(tokens_fed, seconds)

A call costs about fixed + per_token * tokens, where tokens counts every row of the call at its width (the
padding, and the slots riding along between the group's first and last, are computed like real tokens).
Joining a request to a group saves one call's fixed cost and adds (new rows x new width - old rows x old
width - its own tokens) tokens of waste; it joins when the saving is larger. Both figures are fitted online
(least squares with forgetting) over every engine call of the loop, decodes included, so the rule follows
the hardware: on a 2-core CPU, SmolLM2-135M fp32 measured fixed ~36 ms and ~4.5 ms per token (one call of
[3, 7] 108 ms against three calls of [1, 7] 216 ms); on a GPU the fixed cost dominates and wide groups win.
Until the fit has seen calls of different sizes it assumes the fixed cost is PREFILL_FIXED_TOKENS tokens.

On the slot layout every row of a shared call, riders too, starts at 0 (batched_prefill.fits: the call then
computes exactly each row's solo call), so a prefix-cache hit or a decoding slot inside the range keeps a
request alone; on the paged layout rows may start anywhere and only free slots ride along (no attention branch
there). Candidates are the chunks that finish their request's prefill on the plain path (whole_prefill); the
rest (a chunk of a long prompt, prompt_logprobs, a resumed request) keep their own call, as does everything on
a longrope engine. Grouping walks the candidates in slot order, so a group spans a contiguous
slot range: the greedy rule extends the current group or starts a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine_builder.runner import batched_prefill as bp
from engine_builder.runner.request_state import RequestState
from engine_builder.runner.tunables import PREFILL_COST_FORGET, PREFILL_FIXED_TOKENS

if TYPE_CHECKING:
    from engine_builder.runner.generate import Generator

Chunk = tuple[RequestState, int]


class CallCosts:
    """seconds ~ fixed + per_token * tokens over the engine calls seen, older ones fading."""

    def __init__(self) -> None:
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        self._w = PREFILL_COST_FORGET * self._w + 1
        self._x = PREFILL_COST_FORGET * self._x + tokens
        self._y = PREFILL_COST_FORGET * self._y + seconds
        self._xx = PREFILL_COST_FORGET * self._xx + tokens * tokens
        self._xy = PREFILL_COST_FORGET * self._xy + tokens * seconds

    def fixed_tokens(self) -> float:
        """A call's fixed cost in tokens' worth (fixed / per_token), PREFILL_FIXED_TOKENS until measurable."""
        if self._w < 2:
            return PREFILL_FIXED_TOKENS
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mean_x * mean_x
        if var < 1.0:  # every call of (nearly) one size: the slope is unknown
            return PREFILL_FIXED_TOKENS
        per_token = (self._xy / self._w - mean_x * mean_y) / var
        fixed = mean_y - per_token * mean_x
        if per_token <= 0:  # size does not matter here (a GPU far from saturation): batch freely
            return 1e9
        return min(1e9, max(0.0, fixed / per_token))


class PrefillGroups:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: every chunk its own call (SchedulerConfig.batch_prefill)
        self.costs = CallCosts()
        self.batched_calls = 0  # engine calls that prefilled more than one request
        self.batched_requests = 0  # requests prefilled in such a call

    def observe(self, tokens: int, seconds: float) -> None:
        self.costs.observe(tokens, seconds)

    def plan(self, generator: Generator, chunks: Sequence[Chunk]) -> list[list[Chunk]]:
        """The step's chunks in call groups, to run in this order: singletons run Generator.prefill, larger groups
        one shared call (prefill_together)."""
        if len(chunks) < 2 or not self.enabled or not bp.supported(generator):
            return [[c] for c in chunks]
        candidates = sorted((c for c in chunks if bp.whole_prefill(generator, *c)), key=lambda c: c[0].slot)
        if len(candidates) < 2:
            return [[c] for c in chunks]
        starts = {r.slot: bp.start(generator, r) for r, _ in candidates}
        lengths = {r.slot: len(r.prompt_ids) + len(r.token_ids) - starts[r.slot] for r, _ in candidates}
        fixed = self.costs.fixed_tokens()
        groups: list[list[Chunk]] = []
        current: list[Chunk] = []
        for chunk in candidates:
            if current and self._worth(generator, [r.slot for r, _ in current], chunk[0].slot, starts, lengths,
                                       fixed):
                current.append(chunk)
                continue
            if current:
                groups.append(current)
            current = [chunk]
        groups.append(current)
        grouped = {id(r) for r, _ in candidates}
        # groups first: `fits` saw the riders' lengths as they are now, and a rider's own chunk (run after) writes
        # from its length whatever junk the group left past it
        return groups + [[c] for c in chunks if id(c[0]) not in grouped]

    @staticmethod
    def _worth(generator: Generator, group: list[int], slot: int, starts: dict[int, int], lengths: dict[int, int],
               fixed: float) -> bool:
        """Does adding the request at `slot` to the group (slots in ascending order) cost less than a call of its
        own, and does the wider call fit?"""
        slots = [*group, slot]
        if not bp.fits(generator, {s: starts[s] for s in slots}, [lengths[s] for s in slots]):
            return False
        old = (group[-1] - group[0] + 1) * max(lengths[s] for s in group)
        new = (slot - group[0] + 1) * max(lengths[s] for s in slots)
        return new - old - lengths[slot] <= fixed
