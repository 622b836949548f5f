"""Speculative decoding: proposers draft tokens, the target verifies k+1 of them in one engine step.

    from engine_builder import LLM
    llm = LLM("engine-dir", speculative="ngram")                           # prompt lookup
    llm = LLM("engine-dir", speculative=SpeculativeConfig("draft", draft_engine="int4-engine-dir"))

config.py (what to run), proposer.py (the interface), ngram.py and draft.py (the proposers),
acceptance.py (greedy match and the rejection-sampling rule), draft_length.py (fixed or adaptive k),
speculative_decode.py (the loop's decode policy that verifies), stats.py (acceptance rate, mean accepted length).
"""

from __future__ import annotations

from typing import Any

from engine_builder.runner.backend import Backend
from engine_builder.runner.speculative.proposer import Proposal, Proposer
from engine_builder.runner.speculative.speculative_config import METHODS, SpeculativeConfig
from engine_builder.runner.speculative.speculative_decode import SpeculativeDecode
from engine_builder.runner.speculative.stats import SpeculativeStats
from engine_builder.runner.tunables import DRAFT_STOP_MARGIN

__all__ = ["METHODS", "Proposal", "Proposer", "SpeculativeConfig", "SpeculativeDecode", "SpeculativeStats",
           "speculative_decode"]


def speculative_decode(config: SpeculativeConfig, backend: Backend, tokenizer: Any, *, seed: int | None = None,
                       threads: int | None = None) -> SpeculativeDecode:
    """The decode policy of LLM(..., speculative=config): its proposer opened (a draft engine loaded)."""
    if config.method == "ngram":
        from engine_builder.runner.speculative.ngram import NgramProposer

        proposer: Proposer = NgramProposer(config.ngram_max, config.ngram_min)
    else:
        from engine_builder.runner.speculative.draft import DraftProposer

        # the near-tie stop belongs to the adaptive length: a fixed --num-draft-tokens drafts that many
        proposer = DraftProposer(config.draft_engine, tokenizer, backend.vocab_size, config.draft_backend,
                                 threads=threads, seed=seed, stop_margin=DRAFT_STOP_MARGIN if config.adaptive else None)
    return SpeculativeDecode(backend, config=config, proposer=proposer, seed=seed)
