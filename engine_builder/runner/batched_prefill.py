"""Prefill several requests' prompts in ONE engine call (slot or paged KV layout): rows right-padded to the longest.

    prefill_together(generator, [r1, r2, r3], events)     # slots 2, 3, 5: one step over slots [2, 6)

Why: a burst of short prompts (chat turns, or clients that open a stream and leave after the first chunk)
costs one engine call each when prefilled alone, and a small call costs about what a decode step costs
(weight-bandwidth bound on a GPU, a fixed cost per call on a CPU): forty 6-token prompts a second are forty
extra calls that the decoding streams wait behind. One call of [rows, width] does them all.

How, and why it is exact (the same contract the speculative verify step relies on):
  * every row of the call starts at 0 (`fits`): a fresh prompt without a prefix-cache hit, or a slot riding
    along (see below) that holds nothing yet. Then the graph takes the branch a solo prefill takes
    (GroupQueryAttention, passes/lower_ort_attention.py: its If sends batch > 1, seq > 1 calls with any row
    past 0 to the generic Attention-24 block) and each row's logits are bit for bit its solo call's. A row
    past 0 (a prefix-cache hit, a decoding request riding along) would take Attention-24, whose logits differ
    from GQA's by float rounding (up to 5e-5 on SmolLM2 fp32), and a seeded draw's inverse CDF amplifies that
    over the vocab's many small probabilities: 1e-4 to 2e-2 of draws then pick another token
    (benchmarks/prefill_branch_numerics.py), against SamplingParams.seed's promise of the same tokens alone or
    in any batch. Such rows prefill alone. (Slot twins built since drop_ort_attention_fallback have no If:
    the backend runs such a call a row per call, exact but no cheaper than solo calls, so they still do);
  * a row shorter than the longest is right-padded with token 0: the padding lies past the row's length
    once it is advanced, where the causal mask hides it from the real tokens (they are earlier positions),
    and every later step writes a position before it reads it (the row's next decode overwrites the first
    padded position, and so on), exactly as rejected drafts of a verify step;
  * slots inside [first, last] that are not in the group (free, or admitted but prefilling later) ride along
    on token 0 at length 0, like the free rows of a batched decode: junk past their length, overwritten
    before it is read;
  * a row's first token comes from its last real position, at tail index (tail - 1) - padding: the graph
    returns the last min(width, logits_tail) positions, so the padding of every row must stay below
    logits_tail (`fits`);
  * where a row starts is settled when the call is planned (`start` copies a fresh slot's cached prefix
    then), not when it runs: the step's earlier calls store their prompts' blocks in between.
Greedy and sampled tokens (each row keeps its own SamplingParams and seeded generator) equal the request
prefilled alone (tests/executor/test_prefill_batching.py).

The paged layout (`build --kv-layout paged`) has no attention branch: every call, solo or shared, rows at 0 or
past it, runs the same ops (the onnxruntime twin: Attention-24, no If), and a shared call's logits equal the solo
calls' bit for bit there, rows past 0 included (tests/executor/test_paged_prefill_batching.py; TensorRT's paged
graph has no branch either, but nothing here runs it). So a prefix-cache hit may share a call on a paged engine. What
differs is where junk goes: a row's padding is written into the blocks its table maps, which may be blocks it
does not hold yet (prepare_write takes them, up to the row's reservation; they are the blocks its decode would
take next), so `fits` asks the pool for them (`pool_has_room`; if an earlier call of the step took them, the
group's requests are prefilled one by one instead); and only free slots ride along (all-scratch tables), never
an admitted one.

Not here: longrope models (a padded row could cross the rope switch), requests that
score their prompt (prompt_logprobs: per-request, in logits_tail steps), and chunks that leave part of a
prompt for a later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine_builder.runner.core.model_input import ImageEmbeds, ModelInput
from engine_builder.runner.request_state import Event, RequestState

if TYPE_CHECKING:
    from engine_builder.runner.generate import Generator


def supported(generator: Generator) -> bool:
    """Can this generator's backend prefill several rows in one call? (Any KV storage; not with a longrope
    switch, whose re-prefill runs a row alone.)"""
    return generator.backend.reprefill_after is None


def whole_prefill(generator: Generator, r: RequestState, tokens: int) -> bool:
    """Does feeding `tokens` now finish r's prefill, on the plain path (no prompt scoring)? Only such requests
    are batched: the first token is sampled right after the call (a beam search's first step runs alone). A prompt
    with images is one of them: its row's features go into the call (an image is then whole in it, as Gemma 3's
    both-ways image attention needs)."""
    return r.prompt_logprobs is None and r.beams is None and tokens >= generator.prefill_remaining(r) > 0


def start(generator: Generator, r: RequestState) -> int:
    """Where r's row will start: its slot's length, once the prompt's cached blocks are in a fresh slot. They are
    copied NOW (Generator.load_cached_prefix, once per slot), not when the call runs: the step's earlier calls
    store their prompts' blocks before this one runs, and a row that then found its prompt cached would start
    past 0 (the inexact attention branch) and be shorter than planned, its padding past logits_tail and its
    first token sampled from a padding position's logits."""
    return generator.load_cached_prefix(r)


def fits(generator: Generator, starts: dict[int, int], lengths: Sequence[int]) -> bool:
    """Can one call of width max(lengths) run over every slot from the first to the last key of starts (slot ->
    where that request's row starts), the slots between riding along at their own lengths, and give each row
    exactly its solo call's logits? (On a paged engine: and does its pool have the blocks the padding writes?)"""
    return _exact(generator, starts, lengths) and pool_has_room(generator, starts, max(lengths))


def _exact(generator: Generator, starts: dict[int, int], lengths: Sequence[int]) -> bool:
    backend, kv = generator.backend, generator.backend.kv
    width = max(lengths)
    if width > backend.max_input_len or width - min(lengths) >= backend.logits_tail:
        return False
    return kv.rows_fit_one_call(starts, width)


def pool_has_room(generator: Generator, starts: dict[int, int], width: int) -> bool:
    """A paged engine: can its pool give every row the blocks its padded width reaches (within the row's
    reservation; past it the table points at the scratch block)? The scheduler grew each row for its own tokens
    only. Always True for the slot layout (a slot holds max_seq positions: blocks_to_write is 0)."""
    kv = generator.backend.kv
    return kv.has_blocks(sum(kv.blocks_to_write(slot, at + width) for slot, at in starts.items()))


def prefill_together(generator: Generator, requests: Sequence[RequestState], events: list[Event]) -> int:
    """Prefill every request's remaining context in one engine call and sample each one's first token.
    The caller planned the group (start, fits); one that does not fit raises instead of reading a row's logits
    from the wrong position. Returns the tokens the call fed (rows x width)."""
    kv = generator.backend.kv
    by_slot = sorted(requests, key=lambda r: r.slot)
    starts = {r.slot: start(generator, r) for r in by_slot}  # the plan's starts (looked up once per slot)
    lo, hi = by_slot[0].slot, by_slot[-1].slot + 1
    contexts = {r.slot: (r.prompt_ids + r.token_ids)[starts[r.slot]:] for r in by_slot}
    lengths = [len(c) for c in contexts.values()]
    width = max(lengths)
    if not _exact(generator, starts, lengths):  # a negative tail index reads junk
        raise ValueError(f"rows of {lengths} tokens at slots {sorted(starts)} do not fit one call; plan the group "
                         "with batched_prefill.start and fits")
    if not pool_has_room(generator, starts, width):  # the step's earlier calls took the blocks the plan counted on
        fed = 0
        for r in by_slot:
            fed += len(contexts[r.slot])
            generator.prefill(r, events)
        return fed
    for r in by_slot:  # grammar masks are computed in a worker while the engine runs
        if r.sampling.grammar is not None:
            r.sampling.grammar.prefetch()
    slots = np.fromiter(contexts, np.int64, len(contexts))
    batch = ModelInput.ragged(slots, [np.asarray(c, np.int64) for c in contexts.values()], kv.lengths[slots],
                              images=_row_images(by_slot, starts, lengths))
    logits = generator.run_step(batch)  # [n, vocab]: each row's last token (a slot engine pads rows to `width`)
    for r in by_slot:
        kv.advance(r.slot, len(contexts[r.slot]))
        if not r.token_ids and generator.prefix_cache is not None:
            generator.prefix_cache.store(r.cache_prompt, r.slot)
    sample = generator.sampler(logits, [r.sampling for r in by_slot])
    for r, token, lp in zip(by_slot, sample.token_ids, sample.logprobs):
        generator.accept(r, int(token), lp, events)
    return (hi - lo) * width


def _row_images(by_slot: Sequence[RequestState], starts: dict[int, int], lengths: Sequence[int]) -> ImageEmbeds | None:
    """The image features of the call's rows (token_index into their tokens back to back), or None."""
    at, embeds, offset = [], [], 0
    for r, n in zip(by_slot, lengths):
        if r.image is not None:
            index, features = r.image.features_for(starts[r.slot], starts[r.slot] + n)
            at.append(index + offset)
            embeds.append(features)
        offset += n
    if not at or not sum(len(a) for a in at):
        return None
    return ImageEmbeds(np.concatenate(at), np.concatenate(embeds))
