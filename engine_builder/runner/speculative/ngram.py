"""Prompt lookup (n-gram) proposer: the tokens that followed the latest earlier occurrence of the
context's last n tokens (n from ngram_max down to ngram_min), in the prompt or the output so far.
No model: copy and edit tasks, whose answers repeat the prompt, accept most of these drafts
(HF transformers' `prompt_lookup_num_tokens` and vLLM's ngram speculator are the models)."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from engine_builder.runner.request_state import RequestState
from engine_builder.runner.speculative.proposer import NO_PROPOSAL, Proposal


class NgramProposer:
    name = "ngram"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def propose(self, request: RequestState, k: int) -> Proposal:
        return lookup(request.prompt_ids + request.token_ids, k, self.ngram_max, self.ngram_min)

    def release(self, request: RequestState) -> None:
        pass

    def close(self) -> None:
        pass


def lookup(context: list[int], k: int, ngram_max: int = 3, ngram_min: int = 1) -> Proposal:
    """Up to k tokens after the latest earlier match of context's longest matching suffix."""
    if k < 1 or len(context) < 2:
        return NO_PROPOSAL
    ids = np.asarray(context, np.int64)
    for n in range(min(ngram_max, len(ids) - 1), ngram_min - 1, -1):
        suffix = ids[-n:]
        windows = sliding_window_view(ids[:-1], n)  # [len - n, n]: every earlier n-gram (not the suffix itself)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        if starts.size:
            # the latest occurrence with k tokens after it (nearest context), else the earliest (the longest tail)
            full = starts[starts + n + k <= len(ids)]
            follow = int(full[-1] if full.size else starts[0]) + n
            return Proposal(tuple(int(t) for t in ids[follow:follow + k]))
    return NO_PROPOSAL
