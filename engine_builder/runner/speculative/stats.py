"""Counters of one speculative run: what `run --json` and benchmarks report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SpeculativeStats:
    method: str
    verify_steps: int = 0  # requests' verify steps (a request's drafts checked once; requests may share a step)
    plain_steps: int = 0  # one-token steps (no drafts proposed, or the adaptive length chose 0)
    draft_tokens: int = 0  # tokens proposed to the target
    accepted_tokens: int = 0  # of those, tokens that survived verification
    emitted_tokens: int = 0  # tokens verify steps produced: accepted drafts + a correction or bonus each
    batched_verify_steps: int = 0  # engine steps that verified several requests' drafts together

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verify step (accepted drafts + the target's own token): 1.0 means no gain."""
        return self.emitted_tokens / self.verify_steps if self.verify_steps else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "verify_steps": self.verify_steps, "plain_steps": self.plain_steps,
                "batched_verify_steps": self.batched_verify_steps,
                "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "mean_accepted_length": round(self.mean_accepted_length, 4)}
