"""Prompt lookup (n-gram) proposer: the tokens that followed the earlier occurrence of the context's
longest matching suffix (at least ngram_min, at most ngram_max tokens long), in the prompt or the output
so far. No model: copy and edit tasks, whose answers repeat the prompt, accept most of these drafts
(HF transformers' `prompt_lookup_num_tokens` and vLLM's ngram speculator are the models).

The proposal says how long the match was (Proposal.match): a suffix that matches 8 tokens of the prompt
is in the middle of a copy and its continuation is usually right; a 2-token match is often a common
phrase that goes on differently. The draft length controller keeps an acceptance rate per match length
(draft_length.py), so a long match drafts long and a short one drafts short or not at all.
"""

from __future__ import annotations

import numpy as np

from engine_builder.runner.request_state import RequestState
from engine_builder.runner.speculative.proposer import NO_PROPOSAL, Proposal


class NgramProposer:
    name = "ngram"
    cheap = True  # proposing costs microseconds: the generator looks before it chooses the draft length

    def __init__(self, ngram_max: int = 8, ngram_min: int = 2) -> None:
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def propose(self, request: RequestState, k: int) -> Proposal:
        return lookup(request.prompt_ids + request.token_ids, k, self.ngram_max, self.ngram_min)

    def release(self, request: RequestState) -> None:
        pass

    def close(self) -> None:
        pass


def lookup(context: list[int], k: int, ngram_max: int = 8, ngram_min: int = 2) -> Proposal:
    """Up to k tokens after the earlier occurrence of context's longest matching suffix (ngram_min..ngram_max
    tokens). Among equally long matches, the latest with k tokens after it (the nearest context), else the
    earliest (the longest tail)."""
    if k < 1 or len(context) < 2:
        return NO_PROPOSAL
    ids = np.asarray(context, np.int64)
    size = len(ids)
    # candidates: earlier positions j (j < size - 1) holding the last token; the match extends backwards
    ends = np.flatnonzero(ids[:-1] == ids[-1])
    if not ends.size:
        return NO_PROPOSAL
    depth = min(ngram_max, size - 1)
    back = np.arange(depth)
    before = ends[:, None] - back[None, :]  # [candidates, depth]: j, j-1, ... (negative: before the start)
    same = (before >= 0) & (ids[np.maximum(before, 0)] == ids[size - 1 - back][None, :])
    lengths = np.cumprod(same, axis=1).sum(axis=1)  # [candidates]: matched suffix length, up to depth
    best = int(lengths.max())
    if best < ngram_min:
        return NO_PROPOSAL
    starts = ends[lengths == best] + 1  # where each best match's continuation starts
    full = starts[starts + k <= size]
    follow = int(full[-1] if full.size else starts[0])
    return Proposal(tuple(int(t) for t in ids[follow:follow + k]), match=best)
