"""When a request ends, and which of its text may be streamed so far.

Checked after every generated token, in this order (first match wins):
  1. stop token: one of params.stop_token_ids, or the tokenizer's EOS unless ignore_eos.
     Its own text is not returned (vLLM's default, include_stop_str_in_output=False).
  2. stop string: found in the detokenized output text, even when it spans several tokens
     (the search covers the text before this token too). The text is cut just before it.
  3. length: max_new_tokens generated.
Stops beat length on the same step because the model did reach a natural end (OpenAI's
finish_reason "stop" means exactly that). finish_reason is "stop" or "length"; stop_reason
is the stop string or stop token id that matched, None for EOS and length (vLLM's fields).

Streaming: text that might be the start of a stop string is held back (only the longest
suffix that is a prefix of some stop string, not a fixed window), so a client never sees
text that the finished output then lacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from engine_builder.runner.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]


class TextStream(Protocol):
    """What StopChecker needs from a detokenizer (IncrementalDetokenizer fits)."""

    def add(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


@dataclass(frozen=True)
class StepOutput:
    text: str  # new text that is safe to show now
    finished: bool
    finish_reason: FinishReason | None
    stop_reason: int | str | None


class StopChecker:
    """One request's stop logic; owns its text stream so one `step(token_id)` per token does
    detokenization, stop checks and streaming hold-back together."""

    def __init__(self, params: SamplingParams, stream: TextStream, eos_token_ids: Iterable[int] = ()) -> None:
        self.params = params
        self._stream = stream
        self._stop_ids = set(params.stop_token_ids)
        self._eos_ids = set() if params.ignore_eos else {int(t) for t in eos_token_ids}
        self.text = ""  # output text so far, never including a stop string
        self.num_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self._emitted = 0  # len of self.text already returned by step()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def step(self, token_id: int) -> StepOutput:
        if self.finished:
            raise RuntimeError(f"request already finished ({self.finish_reason}); do not feed more tokens")
        token_id = int(token_id)
        self.num_tokens += 1
        is_stop_token = token_id in self._stop_ids or token_id in self._eos_ids
        at_length = self.num_tokens >= self.params.max_new_tokens
        delta = "" if is_stop_token else self._stream.add(token_id)
        if is_stop_token or at_length:
            delta += self._stream.flush()  # an unfinished character at the very end

        previous_len = len(self.text)
        self.text += delta
        match = self._find_stop_string(previous_len)
        if match is not None:
            index, stop = match
            self.text = self.text[:index]
            self.finish_reason, self.stop_reason = "stop", stop
        elif is_stop_token:
            self.finish_reason = "stop"
            self.stop_reason = token_id if token_id in self._stop_ids else None
        elif at_length:
            self.finish_reason = "length"

        end = len(self.text) if self.finished else len(self.text) - self._held_back()
        out = self.text[self._emitted:max(end, self._emitted)]
        self._emitted += len(out)
        return StepOutput(out, self.finished, self.finish_reason, self.stop_reason)

    def _find_stop_string(self, previous_len: int) -> tuple[int, str] | None:
        """Earliest stop string that ends in the new text (the old text had none)."""
        best: tuple[int, str] | None = None
        for stop in self.params.stop:
            index = self.text.find(stop, max(0, previous_len - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that a stop string starts with."""
        held = 0
        for stop in self.params.stop:
            for k in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:k]):
                    held = k
                    break
        return held
