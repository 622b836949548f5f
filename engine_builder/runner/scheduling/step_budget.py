"""The prefill token budget per step while others decode, fixed or measured ("auto").

A fixed budget (vLLM's max_num_batched_tokens) must be tuned per machine: 512 prompt tokens cost a
few milliseconds on a GPU but seconds on a CPU, where they would stall every decoding stream for that
long. "auto" sizes it from what this engine measures: the decoders' step time and the prefill cost per
token, both moving averages, so that one step's prefill costs about one decode step (PREFILL_SHARE):
the decoders' inter-token gap stays near twice their plain gap, whatever the hardware, while a long
prompt still advances every step. Before anything is measured it starts at MIN_CHUNK tokens.
"""

from __future__ import annotations

from engine_builder.runner.tunables import MAX_AUTO_TOKENS, MIN_CHUNK, PREFILL_SHARE, STEP_BUDGET_SMOOTHING


class StepBudget:
    def __init__(self, fixed: int | None) -> None:
        self.fixed = fixed
        self._decode_s: float | None = None  # one batched decode step
        self._per_token_s: float | None = None  # one prefill token, fixed cost of its call included

    @staticmethod
    def _blend(old: float | None, new: float) -> float:
        return new if old is None else (1 - STEP_BUDGET_SMOOTHING) * old + STEP_BUDGET_SMOOTHING * new

    def observe_decode(self, seconds: float) -> None:
        self._decode_s = self._blend(self._decode_s, seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self._per_token_s = self._blend(self._per_token_s, seconds / tokens)

    def tokens(self) -> int:
        """Prompt tokens to prefill this step beside the decoders."""
        if self.fixed is not None:
            return self.fixed
        if self._decode_s is None or self._per_token_s is None:
            return MIN_CHUNK
        return max(MIN_CHUNK, min(MAX_AUTO_TOKENS, int(PREFILL_SHARE * self._decode_s / self._per_token_s)))
