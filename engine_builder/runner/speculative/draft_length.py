"""How many tokens to draft before a verify step: fixed, or adaptive to acceptance and measured cost.

Adaptive: each request keeps decayed counts of accepted and rejected drafts, which give alpha, the
chance a draft token survives, and per draft position j the verify steps that judged a j-th draft and how
many of those it failed. A verify step with k drafts yields 1 + sum_{j<=k} P(the first j survive) tokens,
each survival the position's observed rate shrunk toward alpha by PRIOR_WEIGHT steps (alone, alpha would
be the geometric model (1 - alpha^(k+1)) / (1 - alpha)). Why per position: rejections come in clusters
(measured with an int4 draft at 84 % acceptance: a draft that survives its first tokens mostly survives
whole, one that diverges does so at once), so the geometric model under-rates long drafts, and fixed
k=4 beat the adaptive length in 3 of 4 runs. A step's cost is measured, not assumed: the wall time of a
plain one-token step (t1), the extra time per verified token (slope), and the proposer's time per
drafted token. k is the value in 0..cap with the most tokens per second; 0 means a plain decode step.
When drafts keep failing, k drops to 0 and only a short probe every PROBE_EVERY plain steps checks
whether the text became predictable again, so the worst case stays close to plain decoding. A plain
step every REMEASURE_EVERY steps keeps t1 current.

A proposal that says how long its source matched (ngram: the suffix match length, Proposal.match) is
judged by the acceptance rate of proposals with that match length (capped at MATCH_BUCKETS): measured
on copy tasks and free text, a 2-token match is mostly wrong and an 8-token one mostly right, so one
rate for both drafts too long after a divergence and too short in the middle of a copy. Such a
proposal also drafts at most MATCH_REACH tokens per matched token (k <= 2 * match): a long draft
needs a long match behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_builder.runner.tunables import (
    ALPHA_DECAY,
    COST_EMA,
    MATCH_BUCKETS,
    MATCH_REACH,
    PRIOR_WEIGHT,
    PROBE_EVERY,
    REMEASURE_EVERY,
    UNSEEN_FAILURES,
)


@dataclass
class StepCosts:
    """Measured seconds, shared by a generator's requests (one engine, one machine)."""

    t1: float | None = None  # a plain one-token decode step, sampling included
    slope: float | None = None  # extra seconds per token in a verify step
    draft_token: float = 0.0  # proposer seconds per drafted token (after the first, when draft_first is known)
    draft_first: float | None = None  # a draft model's first token of a proposal: its catch-up step (draft.py)
    # verify widths (and 0: a proposal) seen once. The first step of a new width is not what the next ones cost:
    # the backend makes its binding and onnxruntime plans memory for the new shape (measured: a first width-3
    # step of 109 ms, then ~45 ms, beside t1 40 ms), and with COST_EMA weights one such sample kept an adaptive
    # draft run in plain steps for most of a story at 100 % acceptance
    warm: set[int] = field(default_factory=set)

    def observe_plain(self, seconds: float) -> None:
        self.t1 = seconds if self.t1 is None else (1 - COST_EMA) * self.t1 + COST_EMA * seconds

    def observe_verify(self, tokens: int, seconds: float) -> None:
        if self.t1 is None or tokens < 2:
            return
        if tokens not in self.warm:
            self.warm.add(tokens)
            return
        slope = max(0.0, (seconds - self.t1) / (tokens - 1))
        self.slope = slope if self.slope is None else (1 - COST_EMA) * self.slope + COST_EMA * slope

    def observe_catchup(self, seconds: float) -> None:
        if -1 not in self.warm:
            self.warm.add(-1)
            return
        first = self.draft_first
        self.draft_first = seconds if first is None else (1 - COST_EMA) * first + COST_EMA * seconds

    def drafting(self, k: int) -> float:
        """Seconds to propose k tokens."""
        if self.draft_first is None:
            return k * self.draft_token
        return self.draft_first + (k - 1) * self.draft_token

    def observe_proposal(self, drafted: int, seconds: float) -> None:
        if drafted and 0 not in self.warm:
            self.warm.add(0)
            return
        if drafted:
            per = seconds / drafted
            self.draft_token = per if self.draft_token == 0.0 else (1 - COST_EMA) * self.draft_token + COST_EMA * per

    def verify(self, tokens: int) -> float:
        t1 = self.t1 or 0.0
        slope = self.slope if self.slope is not None else 0.1 * t1  # a prior until the first verify step
        return t1 + slope * (tokens - 1)


@dataclass
class DraftLength:
    """One request's draft length controller."""

    cap: int
    adaptive: bool
    # decayed counts of accepted and rejected drafts per match bucket; a weak prior: alpha 0.5 at first
    accepted: dict[int, float] = field(default_factory=dict)
    rejected: dict[int, float] = field(default_factory=dict)
    # per match bucket, per draft position j (index j - 1): decayed verify steps that judged a j-th draft,
    # and those of them where it was the first rejected
    judged: dict[int, list[float]] = field(default_factory=dict)
    failed: dict[int, list[float]] = field(default_factory=dict)
    plain_run: int = 0  # plain steps chosen in a row
    since_plain: int = field(default=0)

    def successor(self) -> DraftLength:
        """A controller for the next request, starting from this one's acceptance counts (acceptance is mostly
        the proposer's and the model's, not the request's)."""
        return DraftLength(self.cap, self.adaptive, dict(self.accepted), dict(self.rejected),
                           {b: list(v) for b, v in self.judged.items()}, {b: list(v) for b, v in self.failed.items()})

    def alpha(self, match: int = 0) -> float:
        bucket = min(match, MATCH_BUCKETS)
        accepted, rejected = self.accepted.get(bucket, 1.0), self.rejected.get(bucket, 1.0)
        return accepted / (accepted + rejected)

    def expected_tokens(self, k: int, match: int = 0) -> float:
        """Tokens a verify step with k drafts yields: 1 + sum over j <= k of P(the first j drafts survive)."""
        bucket = min(match, MATCH_BUCKETS)
        alpha = min(self.alpha(match), 0.999)
        judged, failed = self.judged.get(bucket, []), self.failed.get(bucket, [])
        tokens, survive = 1.0, 1.0
        for j in range(k):
            n, f = (judged[j], failed[j]) if j < len(judged) else (0.0, 0.0)
            survive *= min((n - f + PRIOR_WEIGHT * alpha) / (n + PRIOR_WEIGHT), 0.999)
            tokens += survive
        return tokens

    def choose(self, costs: StepCosts, limit: int, match: int = 0) -> int:
        """Draft tokens for the next step (0 = plain decode), at most min(cap, limit); match: the length the
        proposal's source matched (0: not known, or the proposal comes after this choice)."""
        cap = min(self.cap, limit)
        if cap < 1:
            return 0
        if not self.adaptive:
            return cap
        if costs.t1 is None or self.since_plain >= REMEASURE_EVERY:
            return 0  # measure a plain step first
        if match:
            cap = min(cap, MATCH_REACH * match)
        best_k, best_rate = 0, 1.0 / max(costs.t1, 1e-9)
        for k in range(1, cap + 1):
            rate = self.expected_tokens(k, match) / max(costs.verify(k + 1) + costs.drafting(k), 1e-9)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and self.plain_run >= PROBE_EVERY:
            return min(2, cap)  # a cheap probe: has the text become predictable again?
        return best_k

    def observe(self, drafted: int, accepted: int, match: int = 0) -> None:
        """After a verify step of `drafted` tokens of which the first `accepted` survived (0 drafted: plain),
        proposed from a source that matched `match` tokens."""
        if drafted == 0:
            self.plain_run += 1
            self.since_plain = 0
            return
        self.plain_run = 0
        self.since_plain += 1
        bucket = min(match, MATCH_BUCKETS)
        self.accepted[bucket] = ALPHA_DECAY * self.accepted.get(bucket, 1.0) + accepted
        self.rejected[bucket] = ALPHA_DECAY * self.rejected.get(bucket, 1.0) + (1 if accepted < drafted else 0)
        judged, failed = self.judged.setdefault(bucket, []), self.failed.setdefault(bucket, [])
        reach = min(accepted + 1, drafted)  # positions judged: the accepted ones and the first rejected
        grow = max(0, reach - len(judged))
        judged += [0.0] * grow
        failed += [0.0] * grow
        first_rejected = accepted if accepted < drafted else None  # its index
        for j in range(len(judged)):
            judged[j] = ALPHA_DECAY * judged[j] + (1 if j < reach else 0)
            # past this step's reach: see UNSEEN_FAILURES
            kept = ALPHA_DECAY if j < reach else ALPHA_DECAY * UNSEEN_FAILURES
            failed[j] = kept * failed[j] + (1 if j == first_rejected else 0)
