"""Preemption by recompute: a running request gives its KV slot and blocks back, and later rebuilds its KV.

A preempted request keeps everything but its cache: the tokens it generated (already streamed to its
client, never sent again), its sampling state (a seeded request's own numpy generator, penalties'
counts, a grammar's position), its stop checker and detokenizer. When it is admitted again its
context, prompt + generated tokens, is prefilled into the new slot (in chunks, under the step's
budget, like any prompt; the prompt's cached blocks are copied when a prefix cache holds them),
and the logits after the last generated token pick its next token: the step its decode would
have run, with the same draw from the same generator. So greedy and seeded requests produce exactly
the tokens they would have without the interruption (tests/executor/test_scheduling.py).

Swapping the KV to host memory instead would save the recompute, but on the onnxruntime backend the
cache already is host memory: recompute costs one chunked prefill and keeps nothing pinned.
"""

from __future__ import annotations

from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.prefix_cache import PrefixCache
from engine_builder.runner.request_state import RequestState


class Resumes:
    """The preempted requests and, once readmitted, how much of their context is still to be recomputed."""

    def __init__(self, kv: KVCache, prefix_cache: PrefixCache | None) -> None:
        self.kv, self.prefix_cache = kv, prefix_cache
        self._at: dict[int, int] = {}  # request id -> tokens it had generated when preempted
        self.preemptions = 0

    def preempt(self, r: RequestState) -> tuple[tuple[int, int], ...]:
        """Free r's KV slots; r goes back to the queue with its state, the caller queues it. Returns the freed
        slots (slot, positions written): the step loop clears what it keeps beside the KV manager for them."""
        freed = r.give_back(self.kv)
        self.preemptions += 1
        if r.beams is not None:  # a search starts again from its prompt when readmitted (it streamed nothing)
            r.beams, r.token_ids = None, []
        elif r.token_ids:
            self._at[r.index] = len(r.token_ids)
        elif r.prompt_logprobs is not None:  # scored mid-prefill: the recompute scores the prompt again
            del r.prompt_logprobs[1:]
        return freed

    def prefill_left(self, r: RequestState) -> int:
        """Context tokens of an admitted request not yet in its slot: the prompt's rest for a new request, prompt
        + generated tokens for a resumed one until its recompute has sampled the next token, else 0."""
        at = self._at.get(r.index)
        if at is None:
            return r.prefill_remaining(self.kv)
        if len(r.token_ids) > at:  # recomputed: its next token came from the prefill, it decodes from here
            del self._at[r.index]
            return 0
        return len(r.prompt_ids) + len(r.token_ids) - self.kv.length(r.slot)

    def load_prompt(self, r: RequestState) -> None:
        """A resumed request just got a slot: map or copy the prompt's cached blocks in (a new request's prefill
        does that itself; a resumed one's prefill starts past the prompt, where Generator.prefill does not look)."""
        if r.index in self._at and self.prefix_cache is not None and self.kv.length(r.slot) == 0:
            self.prefix_cache.load(r.cache_prompt, r.slot)

    def forget(self, r: RequestState) -> None:
        self._at.pop(r.index, None)
