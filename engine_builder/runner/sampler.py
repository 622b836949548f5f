"""Next-token selection for a batch of requests, each with its own SamplingParams.

Order: logit_bias and the grammar's token mask first (as vLLM applies them, so no penalty or
warper can revive a token the grammar forbids), then, as HF transformers applies its logits
processors: repetition penalty (prompt +
generated ids), then presence/frequency penalties (generated ids; OpenAI semantics, not in
HF), then for sampling rows temperature, top_k, top_p, min_p, and a draw. Greedy rows
(temperature 0) take the argmax of the penalized logits.

Logprobs are, by default, log_softmax of the RAW model logits (before penalties and
temperature), as vLLM V1 returns them (its `logprobs_mode="raw_logprobs"` default) and as
OpenAI's API behaves: a token's logprob does not change with the request's temperature, and
it is what evaluation harnesses expect. `Sampler(logprobs_mode="processed")` returns
log_softmax of the logits actually sampled from (filtered tokens are -inf).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine_builder.runner import logits_processors as lp
from engine_builder.runner.grammar import GrammarMatcher
from engine_builder.runner.sampling_constraints import constrain
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.util.errors import InputError


class SamplingState:
    """One request's sampler-side state: its params, its generator and the token statistics
    its penalties need. Mutable by design (it grows by one token per step); the generation
    loop calls `append` with every token it accepts."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.output_ids: list[int] = []
        self.grammar: GrammarMatcher | None = None  # set by the Generator for json_schema / regex / choice
        # A request with a seed owns its generator, so its draws do not depend on which other
        # requests share the batch; unseeded requests draw from the Sampler's generator.
        self.rng = np.random.default_rng(params.seed) if params.seed is not None else None
        ids = np.asarray(prompt_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise InputError(f"prompt token ids must be in [0, {vocab_size}) for this model's vocab; "
                             f"got {int(ids.min())}..{int(ids.max())}; check the tokenizer matches the engine")
        # a bias on an id the model has no logit for would be skipped, so the caller's intent would be lost silently
        bad = [token for token, _ in params.logit_bias or () if token >= vocab_size]
        if bad:
            raise InputError(f"logit_bias token id {bad[0]} is past this model's vocabulary of {vocab_size} ids "
                             f"(valid: 0..{vocab_size - 1}); drop it or take the id from this engine's tokenizer")
        # Kept incrementally (O(1) per token) instead of rebuilt from id lists every step.
        self.seen: np.ndarray | None = None  # [vocab] bool, prompt + generated
        self.counts: np.ndarray | None = None  # [vocab] int32, generated only
        if params.repetition_penalty != 1.0:
            self.seen = np.zeros(vocab_size, dtype=bool)
            self.seen[ids] = True
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            self.counts = np.zeros(vocab_size, dtype=np.int32)

    def append(self, token_id: int) -> None:
        self.output_ids.append(int(token_id))
        if self.grammar is not None:
            self.grammar.accept(token_id)
        if self.seen is not None:
            self.seen[token_id] = True
        if self.counts is not None:
            self.counts[token_id] += 1


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token (vLLM/OpenAI convention)
    top: tuple[tuple[int, float], ...]  # (token_id, logprob), most likely first; len = params.logprobs


@dataclass(frozen=True)
class SampleOutput:
    token_ids: np.ndarray  # [batch] int64
    logprobs: tuple[TokenLogprobs | None, ...]  # per row; None where the request did not ask


class Sampler:
    def __init__(self, seed: int | None = None, logprobs_mode: Literal["raw", "processed"] = "raw") -> None:
        if logprobs_mode not in ("raw", "processed"):
            raise InputError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self._rng = np.random.default_rng(seed)  # for rows without their own seed

    def process(self, logits: np.ndarray, states: Sequence[SamplingState]) -> np.ndarray:
        """The logits each row's token is chosen from [batch, vocab] float32: penalized for
        every row, then temperature/top_k/top_p/min_p-warped for sampling rows."""
        x = np.array(logits, dtype=np.float32)  # [batch, vocab], a copy: the caller's stays raw
        if x.ndim != 2 or x.shape[0] != len(states):
            raise ValueError(f"logits must be [batch={len(states)}, vocab], got {x.shape}")
        for s in states:
            if s.vocab_size != x.shape[1]:
                raise ValueError(f"state built for vocab {s.vocab_size}, logits have {x.shape[1]}")
        constrain(x, states)  # logit_bias, then the grammar's mask (sampling_constraints.py)

        rows = np.flatnonzero([s.seen is not None for s in states])
        if rows.size:
            seen = [np.flatnonzero(states[r].seen) for r in rows]  # per row: distinct context ids
            penalty = np.array([states[r].params.repetition_penalty for r in rows])
            x[rows] = lp.repetition_penalty(x[rows], seen, penalty)
        rows = np.flatnonzero([s.counts is not None for s in states])
        if rows.size:
            generated = [np.flatnonzero(states[r].counts) for r in rows]  # per row: distinct generated ids
            counts = [states[r].counts[ids] for r, ids in zip(rows, generated)]
            pres = np.array([states[r].params.presence_penalty for r in rows])
            freq = np.array([states[r].params.frequency_penalty for r in rows])
            x[rows] = lp.presence_frequency_penalty(x[rows], generated, counts, pres, freq)

        rows = np.flatnonzero([not s.params.greedy for s in states])
        if rows.size:
            ps = [states[r].params for r in rows]
            sub = lp.temperature(x[rows], np.array([p.temperature for p in ps]))
            sub = lp.top_k(sub, np.array([p.top_k for p in ps]))
            sub = lp.top_p(sub, np.array([p.top_p for p in ps]))
            x[rows] = lp.min_p(sub, np.array([p.min_p for p in ps]))
        return x

    def __call__(self, logits: np.ndarray, states: Sequence[SamplingState]) -> SampleOutput:
        """Choose one token per row. logits [batch, vocab] (float32 from the decoder)."""
        processed = self.process(logits, states)  # [batch, vocab]
        batch, vocab = processed.shape
        tokens = processed.argmax(axis=-1).astype(np.int64)  # [batch]; greedy rows keep this

        rows = np.flatnonzero([not s.params.greedy for s in states])
        if rows.size:
            # Inverse-CDF draw: one uniform per row from that row's generator, in vocab order (no
            # sort). Unnormalized float32 weights: float64 exp/cumsum cost 4x more at 150k vocab
            # and float32 rounding (~1e-7 relative) is far below any sampling effect. u is in
            # (0, 1], so a zero-weight token (cdf equal to its predecessor's) is never the first
            # position with cdf >= target.
            sub = processed[rows]  # [rows, vocab]
            cdf = np.cumsum(np.exp(sub - sub.max(axis=-1, keepdims=True)), axis=-1)  # [rows, vocab]
            rngs = [self._rng if states[r].rng is None else states[r].rng for r in rows]
            u = np.array([1.0 - g.random() for g in rngs])  # [rows]
            # float64 target: u * total <= total exactly, so the search never runs off the end
            target = (u * cdf[:, -1])[:, None]  # [rows, 1]
            tokens[rows] = np.minimum((cdf < target).sum(axis=-1), vocab - 1)

        return SampleOutput(tokens, self._logprobs(logits, processed, tokens, states))

    def _logprobs(self, raw: np.ndarray, processed: np.ndarray, tokens: np.ndarray,
                  states: Sequence[SamplingState]) -> tuple[TokenLogprobs | None, ...]:
        rows = np.flatnonzero([s.params.logprobs is not None for s in states])
        out: list[TokenLogprobs | None] = [None] * len(states)
        if not rows.size:
            return tuple(out)
        source = raw if self.logprobs_mode == "raw" else processed
        logp = lp.log_softmax(np.asarray(source)[rows])  # [rows, vocab]
        vocab = logp.shape[-1]
        chosen = logp[np.arange(rows.size), tokens[rows]]  # [rows]
        ranks = (logp > chosen[:, None]).sum(axis=-1) + 1  # [rows]
        ns = [min(states[r].params.logprobs, vocab) for r in rows]
        n_max = max(ns)
        if n_max:
            # argpartition finds the n best in O(vocab); only those n get sorted
            top = np.argpartition(-logp, n_max - 1, axis=-1)[:, :n_max]  # [rows, n_max]
            top_lp = np.take_along_axis(logp, top, axis=-1)
            order = np.argsort(-top_lp, axis=-1, kind="stable")
            top = np.take_along_axis(top, order, axis=-1)
            top_lp = np.take_along_axis(top_lp, order, axis=-1)
        for i, r in enumerate(rows):
            pairs = tuple((int(top[i, j]), float(top_lp[i, j])) for j in range(ns[i])) if ns[i] else ()
            out[r] = TokenLogprobs(int(tokens[r]), float(chosen[i]), int(ranks[i]), pairs)
        return tuple(out)
