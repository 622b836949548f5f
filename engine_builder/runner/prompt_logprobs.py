"""Logprobs of the prompt's own tokens (OpenAI's echo + logprobs, vLLM's prompt_logprobs): what an
evaluation harness's loglikelihood requests read.

A step's logits cover its last logits_tail positions (16 by default; BuildConfig.logits_tail), so a
request that asks for them has its prompt fed logits_tail tokens per engine call (Generator.
_prefill_scored), every position scored; an engine built before logits_tail gives the last position
only and is fed one token per call. Each position's logits are log_softmax'ed in float32, exactly as
the Sampler's raw logprobs. Position 0 has no logprob (nothing
predicts the first token): None there, as OpenAI returns null.
"""

from __future__ import annotations

import numpy as np

from engine_builder.runner.logits_processors import log_softmax
from engine_builder.runner.sampler import TokenLogprobs


def score(logits: np.ndarray, token_id: int, top_n: int) -> TokenLogprobs:
    """logits [1, vocab] predicting token_id: its logprob, rank and the top_n alternatives."""
    logp = log_softmax(np.asarray(logits, np.float32).reshape(1, -1))[0]  # [vocab]
    chosen = float(logp[token_id])
    rank = int((logp > logp[token_id]).sum()) + 1
    top: tuple[tuple[int, float], ...] = ()
    if top_n:
        best = np.argpartition(-logp, top_n - 1)[:top_n]
        best = best[np.argsort(-logp[best], kind="stable")]
        top = tuple((int(t), float(logp[t])) for t in best)
    return TokenLogprobs(int(token_id), chosen, rank, top)
