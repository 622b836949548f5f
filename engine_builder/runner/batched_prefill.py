"""Prefill several requests' prompts in ONE engine call (slot KV layout): rows right-padded to the longest.

    prefill_together(generator, [r1, r2, r3], events)     # slots 2, 3, 5: one step over slots [2, 6)

Why: a burst of short prompts (chat turns, or clients that open a stream and leave after the first chunk)
costs one engine call each when prefilled alone, and a small call costs about what a decode step costs
(weight-bandwidth bound on a GPU, a fixed cost per call on a CPU): forty 6-token prompts a second are forty
extra calls that the decoding streams wait behind. One call of [rows, width] does them all.

How, and why it is exact (the same contract the speculative verify step relies on):
  * each row writes its tokens at its own length (the graph's per-row past_lengths), so a row that starts
    past a prefix-cache hit, or a resumed request's context, lines up like a solo prefill would;
  * a row shorter than the longest is right-padded with token 0: the padding lies past the row's length
    once it is advanced, where the causal mask hides it from the real tokens (they are earlier positions),
    and every later step writes a position before it reads it (the row's next decode overwrites the first
    padded position, and so on), exactly as rejected drafts of a verify step;
  * slots inside [first, last] that are not in the group (decoding, free, or mid-way through a chunked
    prefill) ride along on token 0 at their own length, like the free rows of a batched decode: junk past
    their length, overwritten before it is read;
  * a row's first token comes from its last real position, at tail index (tail - 1) - padding: the graph
    returns the last min(width, logits_tail) positions, so the padding of every row must stay below
    logits_tail (`fits`).
Greedy tokens equal the request prefilled alone (tests/executor/test_prefill_batching.py).

Not here: the paged layout (a padded or riding row would write into blocks its table may not hold yet:
per-request prefill there), longrope models (a padded row could cross the rope switch), requests that
score their prompt (prompt_logprobs: per-request, in logits_tail steps), and chunks that leave part of a
prompt for a later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine_builder.runner.kv_cache import KVCacheManager
from engine_builder.runner.request_state import Event, RequestState

if TYPE_CHECKING:
    from engine_builder.runner.generate import Generator


def supported(generator: Generator) -> bool:
    """Can this generator's backend prefill several rows in one call? (slot layout, no longrope switch)"""
    backend = generator.backend
    return isinstance(backend.kv, KVCacheManager) and backend.reprefill_after is None


def whole_prefill(generator: Generator, r: RequestState, tokens: int) -> bool:
    """Does feeding `tokens` now finish r's prefill, on the plain path (no prompt scoring), for a greedy
    request? Only such requests are batched: the first token is sampled right after the call. Sampled ones
    keep their own call: in one CI run a seeded request's streamed and non-streamed twins (one batched, one
    not, by timing) drew different first tokens (tests/server/test_serve_concurrency.py), cause not found yet."""
    return r.params.greedy and r.prompt_logprobs is None and tokens >= generator.prefill_remaining(r) > 0


def start(generator: Generator, r: RequestState) -> int:
    """Where r's row will start: its slot's length, or past the prompt's cached blocks that Generator.prefill
    (or prefill_together) would load into a still-empty slot. Looks only: nothing is loaded yet."""
    kv_length, cache = generator.backend.kv.length(r.slot), generator.prefix_cache
    if cache is not None and not r.token_ids and kv_length == 0:
        return len(cache.match(r.prompt_ids)) * cache.block_size
    return kv_length


def fits(generator: Generator, starts: dict[int, int], lengths: Sequence[int]) -> bool:
    """Can one call of width max(lengths) run over every slot from the first to the last key of starts (slot ->
    where that request's row starts), the slots between riding along at their own lengths?"""
    backend, kv = generator.backend, generator.backend.kv
    width = max(lengths)
    if width > backend.max_input_len or width - min(lengths) >= backend.logits_tail:
        return False
    lo, hi = min(starts), max(starts) + 1
    rows = kv.lengths[lo:hi].copy()
    for slot, at in starts.items():
        rows[slot - lo] = at
    # every row of the range writes `width` positions at its own length: none may run past the buffer
    return bool((rows + width <= kv.max_seq).all())


def prefill_together(generator: Generator, requests: Sequence[RequestState], events: list[Event]) -> int:
    """Prefill every request's remaining context in one engine call and sample each one's first token.
    The caller checked `fits`. Returns the tokens the call fed (rows x width)."""
    backend, kv, cache = generator.backend, generator.backend.kv, generator.prefix_cache
    by_slot = sorted(requests, key=lambda r: r.slot)
    for r in by_slot:  # cached blocks are copied, not computed (as Generator.prefill does)
        if cache is not None and not r.token_ids and kv.length(r.slot) == 0:
            cache.load(r.prompt_ids, r.slot)
    lo, hi = by_slot[0].slot, by_slot[-1].slot + 1
    contexts = {r.slot: (r.prompt_ids + r.token_ids)[kv.length(r.slot):] for r in by_slot}
    width = max(len(c) for c in contexts.values())
    ids = np.zeros((hi - lo, width), np.int64)  # riders and padding: token 0
    for slot, context in contexts.items():
        ids[slot - lo, :len(context)] = context
    for r in by_slot:  # grammar masks are computed in a worker while the engine runs
        if r.sampling.grammar is not None:
            r.sampling.grammar.prefetch()
    backend.bind(lo, ids)
    backend.execute()
    tail = backend.read_tail_logits()  # [rows, min(width, logits_tail), vocab]: a view, valid until the next step
    last = tail.shape[1] - 1
    logits = np.stack([tail[r.slot - lo, last - (width - len(contexts[r.slot]))] for r in by_slot])  # [n, vocab]
    for r in by_slot:
        kv.advance(r.slot, len(contexts[r.slot]))
        if not r.token_ids and generator.prefix_cache is not None:
            generator.prefix_cache.store(r.prompt_ids, r.slot)
    sample = generator.sampler(logits, [r.sampling for r in by_slot])
    for r, token, lp in zip(by_slot, sample.token_ids, sample.logprobs):
        generator._accept(r, int(token), lp, events)
    return (hi - lo) * width
