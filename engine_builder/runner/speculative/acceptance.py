"""Which token a verify step emits at each position: the draft token when it survives, else a correction.

Greedy (temperature 0): the target's argmax; a draft survives when it equals it, so the output is the
target's greedy output whatever was proposed. Sampling: the rejection rule of Leviathan et al. (2023)
and Chen et al. (2023): a draft token d drawn from q survives with probability min(1, p(d) / q(d)); on
rejection the token is drawn from max(p - q, 0), normalized. Every emitted token is then distributed
exactly as the target's p. A deterministic proposer (ngram, a greedy draft) has a one-hot q, so d
survives with probability p(d) and the correction is drawn from p without d.
"""

from __future__ import annotations

import numpy as np


def probabilities(processed: np.ndarray) -> np.ndarray:
    """[vocab] float64 softmax of one row of processed logits (-inf -> 0)."""
    x = processed.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the distribution p (inverse CDF; u in (0, 1] so a zero-probability token never wins)."""
    cdf = np.cumsum(p)
    u = 1.0 - rng.random()
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="left"), p.size - 1))


def verify_token(processed: np.ndarray, draft: int, q: np.ndarray | None, greedy: bool,
                 rng: np.random.Generator) -> tuple[int, bool]:
    """The token to emit at a draft position, and whether it is the draft (accepted).
    processed [vocab]: the target's logits after penalties and warping; q [vocab] the draft's distribution."""
    if greedy:
        token = int(np.argmax(processed))
        return token, token == draft
    p = probabilities(processed)
    q_draft = 1.0 if q is None else float(q[draft])
    if rng.random() * q_draft < p[draft]:  # u < p(d) / q(d), without dividing by a tiny q
        return draft, True
    if q is None:
        residual = p.copy()
        residual[draft] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0.0:  # p == q (up to rounding): rejection had probability 0; p is the answer
        residual = p
    return draw(residual / residual.sum(), rng), False


def bonus_token(processed: np.ndarray, greedy: bool, rng: np.random.Generator) -> int:
    """The token after the last accepted draft, from the target alone."""
    return int(np.argmax(processed)) if greedy else draw(probabilities(processed), rng)
