"""What a proposer gives the verify step, and the interface every proposer implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine_builder.runner.request_state import RequestState


@dataclass(frozen=True)
class Proposal:
    tokens: tuple[int, ...]  # draft tokens continuing the request's context (may be empty: plain decode)
    # [len(tokens), vocab] float64: the distribution each draft token was sampled from (a draft model
    # sampling); None = the tokens were chosen deterministically (ngram, greedy draft): a one-hot q
    probs: np.ndarray | None = None
    # how many context tokens the proposal's source matched (ngram: the suffix match length), 0 = not known;
    # the draft length controller keeps a separate acceptance rate per match length (draft_length.py)
    match: int = 0


NO_PROPOSAL = Proposal(())


class Proposer(Protocol):
    name: str

    def propose(self, request: RequestState, k: int) -> Proposal:
        """Up to k tokens that may follow request.prompt_ids + request.token_ids."""
        ...

    def release(self, request: RequestState) -> None:
        """The request finished (or failed): drop what the proposer keeps for it."""
        ...

    def close(self) -> None: ...
