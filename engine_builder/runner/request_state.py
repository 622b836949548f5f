"""What the generation loop (generate.py) and beam search share: a request's state, the events it
yields, and the clock that sums a run's prefill / decode / engine time."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine_builder.runner.backend import Backend
from engine_builder.runner.beam_search import BeamSearch
from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.sampler import SamplingState, TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.stopping import FinishReason, StopChecker


@dataclass(frozen=True)
class Event:
    request: int  # RequestState.index: the prompt's index in this run (an executor's request id)
    text: str  # new text safe to show (stop-string hold-back applied)
    finished: bool
    token_id: int | None = None  # the token this event is for
    logprobs: TokenLogprobs | None = None  # of token_id, when the request asked for logprobs


@dataclass(frozen=True)
class Timings:
    prefill_ms: float  # engine + sampling time of every prefill step (prompt -> first token)
    decode_tok_s: float  # tokens from decode steps / time in decode steps, all requests together
    decode_tokens: int
    decode_steps: int
    decode_seconds: float
    execute_seconds: float  # inside the backend's engine call, decode steps only
    overhead_share: float  # (decode_seconds - execute_seconds) / decode_seconds: Python per step

    def to_json(self) -> dict[str, float]:
        return {"prefill_ms": round(self.prefill_ms, 3), "decode_tok_s": round(self.decode_tok_s, 3),
                "decode_tokens": self.decode_tokens, "decode_steps": self.decode_steps,
                "overhead_share": round(self.overhead_share, 5)}


@dataclass
class RequestState:
    """One request's progress. Mutable by design: it grows by a token per step."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams
    sampling: SamplingState
    stop: StopChecker
    slot: int | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    text: str = ""  # final text (filled when finished)
    # params.prompt_logprobs: one per prompt token, None for the first (runner/prompt_logprobs.py)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # the prompt's cached prefix was looked up for this slot (Generator.load_cached_prefix): at most once
    prefix_looked_up: bool = False
    # num_beams > 1: the search, and a KV slot per beam (the first is `slot`); token_ids is the leading beam's
    # until the search ends, then the best finished hypothesis
    beams: BeamSearch | None = None
    beam_slots: tuple[int, ...] = ()
    image: ImagePrompt | None = None  # a vision-language prompt: features spliced in at its image positions

    @property
    def cache_prompt(self) -> list[int]:
        """The prompt as the prefix cache keys it: image positions by their image's content, not the image token."""
        return self.prompt_ids if self.image is None else self.image.key

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def slots(self) -> tuple[int, ...]:
        """The KV slots this request holds: one per beam, or its one slot (none when it holds none)."""
        return self.beam_slots or (() if self.slot is None else (self.slot,))

    def prefill_remaining(self, kv: KVCache) -> int:
        """Prompt tokens not yet in this request's slot (0 once its first token is sampled)."""
        return 0 if self.token_ids else len(self.prompt_ids) - kv.length(self.slot)

    def take_slots(self, slots: tuple[int, ...]) -> None:
        """Hold these KV slots (KVCache.allocate_sequences): one, or a beam search's one per beam."""
        self.slot, self.beam_slots = slots[0], (slots if len(slots) > 1 else ())

    def give_back(self, kv: KVCache) -> tuple[tuple[int, int], ...]:
        """Free the KV slots this request holds (bookkeeping and the KV manager's own storage); returns each freed
        slot with the positions it had written, for whoever clears state kept beside the KV manager
        (Generator.clear_slots)."""
        freed = tuple((s, kv.length(s)) for s in self.slots)
        for s, _ in freed:
            kv.free(s)
        self.slot, self.beam_slots = None, ()
        self.prefix_looked_up = False  # a later slot (a preempted request's) is empty again
        return freed


class StepClock:
    """Sums of prefill / decode / engine time for one run."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.prefill = self.decode = self.execute = 0.0
        self.decode_tokens = self.decode_steps = 0

    def decode_step(self, seconds: float, execute_seconds: float, tokens: int, steps: int = 1) -> None:
        """One decode step that took SECONDS, EXECUTE_SECONDS of them in the engine, and emitted TOKENS (STEPS=0:
        the tokens of a step counted when it was launched, async scheduling's wait for them)."""
        self.decode += seconds
        self.execute += execute_seconds
        self.decode_tokens += tokens
        self.decode_steps += steps

    def proposing(self, seconds: float, execute_seconds: float) -> None:
        """Time a speculative step spent proposing (a draft model's engine calls: EXECUTE_SECONDS of them) before
        its verify step: decode time that emits no token itself."""
        self.decode += seconds
        self.execute += execute_seconds

    def timings(self) -> Timings:
        tok_s = self.decode_tokens / self.decode if self.decode > 0 else 0.0
        share = (self.decode - self.execute) / self.decode if self.decode > 0 else 0.0
        return Timings(self.prefill * 1e3, tok_s, self.decode_tokens, self.decode_steps, self.decode,
                       self.execute, share)
