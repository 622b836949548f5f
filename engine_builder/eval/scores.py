"""Running sums over scored positions: the model's and the reference's negative log-likelihood of the
next token, KL(reference || model) of the next-token distributions, and top-1 agreement.

Each engine step hands over [rows, vocab] float32 logits, one row per window; nothing of size
[tokens, vocab] is ever held. log_softmax and the sums run in float64: the KL of two close models
is a sum of 49k products of tiny differences of log-probabilities of magnitude ~10, where fp32's
~1e-7 relative rounding would be a visible share of a KL near 1e-4.
"""

from __future__ import annotations

import math

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[rows, vocab] -> float64 log-probabilities [rows, vocab]."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


class ScoreSums:
    def __init__(self) -> None:
        self.positions = 0
        self.nll = 0.0  # sum of -log p_model(next token)
        self.reference_nll = 0.0
        self.kl = 0.0  # sum of KL(p_reference || p_model) per position
        self.top1_matches = 0  # positions where both argmaxes agree

    def add(self, logits: np.ndarray, targets: np.ndarray, reference_logits: np.ndarray | None = None) -> None:
        """logits [rows, vocab] predicting targets [rows]; reference_logits [rows, vocab] for the same positions."""
        rows = np.arange(len(targets))
        logp = log_softmax(logits)  # [rows, vocab]
        self.nll -= float(logp[rows, targets].sum())
        if reference_logits is not None:
            ref_logp = log_softmax(reference_logits)  # [rows, vocab]
            self.reference_nll -= float(ref_logp[rows, targets].sum())
            ref_p = np.exp(ref_logp)
            # 0 * log(0 / q) is 0: a token the reference rules out (logit -inf) adds nothing
            with np.errstate(invalid="ignore"):
                terms = np.where(ref_p > 0, ref_p * (ref_logp - logp), 0.0)
            self.kl += float(terms.sum())
            self.top1_matches += int((logp.argmax(-1) == ref_logp.argmax(-1)).sum())
        self.positions += len(targets)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.positions)

    @property
    def reference_ppl(self) -> float:
        return math.exp(self.reference_nll / self.positions)

    @property
    def mean_kl(self) -> float:
        return self.kl / self.positions

    @property
    def top1_agreement(self) -> float:
        return self.top1_matches / self.positions
