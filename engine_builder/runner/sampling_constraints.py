"""The first step of Sampler.process: OpenAI's logit_bias, then the grammar's token mask (-inf outside it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine_builder.runner.logits_processors import NEG_INF


def constrain(x: np.ndarray, states: Sequence[Any]) -> None:
    """In place on x [batch, vocab] float32 (the Sampler's own copy of the logits)."""
    vocab = x.shape[1]
    for row, s in enumerate(states):
        bias = s.params.logit_bias
        if bias:
            ids = np.fromiter((t for t, _ in bias), np.int64, len(bias))
            keep = ids < vocab  # ids past the model's vocab have no logit to bias
            x[row, ids[keep]] += np.fromiter((b for _, b in bias), np.float32, len(bias))[keep]
        if s.grammar is not None:
            allowed = s.grammar.allowed()  # [vocab] bool
            if not allowed.any() and s.grammar.eos is not None:
                # the grammar failed (a token it did not allow was forced): end the request rather than
                # let it go on unconstrained
                allowed[s.grammar.eos] = True
            x[row, ~allowed] = NEG_INF
