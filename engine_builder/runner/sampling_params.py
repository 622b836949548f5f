"""Per-request decoding settings, with vLLM's names and neutral values, HF's processor semantics.

Neutral ("off") values: temperature 0 = greedy, top_k 0, top_p 1.0, min_p 0.0,
repetition_penalty 1.0, presence/frequency_penalty 0.0. A checkpoint's own defaults come
from its generation_config.json through `SamplingParams.from_generation_config`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engine_builder.runner.sampling_extras import normalize_extras
from engine_builder.util.errors import InputError

# HF `generate()` samples with top_k=50 when sampling is on and neither the call nor the
# checkpoint sets top_k (GenerationConfig._get_default_generation_params); merged configs
# reproduce that so `trtbuild run` draws from the same distribution as HF for that model.
HF_DEFAULT_TOP_K = 50
# Upper bounds where a larger value changes nothing that matters: at temperature 100 a real model's logit
# spread (~30) shrinks to 0.3, a draw already close to uniform over the vocabulary; a repetition penalty of
# 100 already all but removes a repeated token. Far beyond, values overflow: temperature 1e308 was
# accepted and its scaled logits overflowed; length_penalty is an exponent of the length.
MAX_TEMPERATURE = 100.0
MAX_PENALTY_FACTOR = 100.0
# Below this a temperature means greedy, as in vLLM (_SAMPLING_EPS): dividing logits by a
# tiny temperature overflows float32 to inf, and inf - inf = NaN in the softmax.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    # 16 like vLLM's SamplingParams.max_tokens and OpenAI's completions API: a bounded, cheap
    # default. HF's default (max_length=20) counts the prompt too, which surprises people.
    # A checkpoint's generation_config.json max_new_tokens overrides it when merged.
    max_new_tokens: int = 16
    # 0 = greedy (argmax after penalties). None (the default) = the engine's own: LLM resolves it from
    # generation_config.json with HF's rule (greedy unless do_sample), greedy when there is none, so
    # `LLM(dir).generate(prompt, SamplingParams())` gives the same text every run unless the model
    # asks to sample (issue 16; a bare SamplingParams() counts as greedy).
    temperature: float | None = None
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # HF semantics, over prompt + generated ids; 1.0 = off
    presence_penalty: float = 0.0  # OpenAI semantics, over generated ids only
    frequency_penalty: float = 0.0  # OpenAI semantics, over generated ids only
    seed: int | None = None  # per-request generator: same tokens alone or in any batch
    stop: tuple[str, ...] = ()  # stop strings; the returned text ends before the match
    stop_token_ids: tuple[int, ...] = ()  # stop on these ids; their text is not returned
    ignore_eos: bool = False  # keep going past the tokenizer's EOS (benchmarks)
    logprobs: int | None = None  # None = off; n = sampled token's logprob + the top n
    # Beam search settings; validated here, used by the generation loop (not the Sampler).
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    # Structured output and logit_bias (runner/sampling_extras.py checks and normalizes them).
    json_schema: str | dict | None = None  # stored as canonical JSON text
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None  # {token_id: bias} given; sorted pairs stored
    # (an id at or past the model's vocabulary is refused by SamplingState, which knows the vocabulary)
    prompt_logprobs: int | None = None  # None = off; n = each prompt token's logprob + the top n (vLLM)
    # Scheduling (executor/): lower runs first, as vLLM's priority; equal priorities are first come, first served
    priority: int = 0

    def __post_init__(self) -> None:
        # Lists (from JSON/CLI) become tuples so the frozen object is hashable and immutable.
        for name in ("stop", "stop_token_ids"):
            value = getattr(self, name)
            if isinstance(value, str) and name == "stop":
                value = (value,)  # one stop string, not its characters
            try:
                object.__setattr__(self, name, tuple(value or ()))
            except TypeError:
                raise InputError(f"{name} must be a list, got {value!r}") from None
        normalize_extras(self)
        self.validate()

    def validate(self) -> None:
        """Raise InputError naming the first out-of-range field and its valid range."""
        _check_int(self.max_new_tokens, "max_new_tokens", lambda v: v >= 1, ">= 1")
        if self.temperature is not None:
            _check_num(self.temperature, "temperature", lambda v: 0 <= v <= MAX_TEMPERATURE,
                       f"in [0, {MAX_TEMPERATURE:g}] (0 = greedy)")
        _check_int(self.top_k, "top_k", lambda v: v >= 0, ">= 0 (0 = off)")
        _check_num(self.top_p, "top_p", lambda v: 0 < v <= 1, "in (0, 1] (1 = off)")
        _check_num(self.min_p, "min_p", lambda v: 0 <= v <= 1, "in [0, 1] (0 = off)")
        _check_num(self.repetition_penalty, "repetition_penalty", lambda v: 0 < v <= MAX_PENALTY_FACTOR,
                   f"in (0, {MAX_PENALTY_FACTOR:g}] (1 = off)")
        # OpenAI's range; beyond it the penalty swamps the logits
        _check_num(self.presence_penalty, "presence_penalty", lambda v: -2 <= v <= 2, "in [-2, 2] (0 = off)")
        _check_num(self.frequency_penalty, "frequency_penalty", lambda v: -2 <= v <= 2, "in [-2, 2] (0 = off)")
        if self.seed is not None:  # numpy's SeedSequence rejects negative seeds
            _check_int(self.seed, "seed", lambda v: v >= 0, "None or an integer >= 0")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InputError(f"stop must be a list of non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            _check_int(t, "stop_token_ids", lambda v: v >= 0, "a list of token ids >= 0")
        _check_bool(self.ignore_eos, "ignore_eos")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", lambda v: v >= 0, "None (off) or an integer >= 0 (top alternatives)")
        _check_int(self.num_beams, "num_beams", lambda v: v >= 1, ">= 1 (1 = no beam search)")
        _check_num(self.length_penalty, "length_penalty", lambda v: abs(v) <= MAX_PENALTY_FACTOR,
                   f"in [-{MAX_PENALTY_FACTOR:g}, {MAX_PENALTY_FACTOR:g}] (1.0 = neutral)")
        _check_bool(self.early_stopping, "early_stopping")
        _check_int(self.priority, "priority", lambda v: -(2**31) <= v < 2**31,
                   "an integer (lower runs first; 0 by default)")

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature < GREEDY_TEMPERATURE

    def with_engine_defaults(self, generation_config: Mapping[str, Any] | None) -> SamplingParams:
        """These params with temperature None resolved from GENERATION_CONFIG (HF's rule: sample only with
        do_sample, then at its temperature, top_k (else HF's 50), top_p and min_p where these are still
        off here); greedy without one. A temperature given explicitly is kept with everything else."""
        if self.temperature is not None:
            return self
        gc = {k: v for k, v in (generation_config or {}).items() if v is not None}
        if not gc.get("do_sample"):
            return dataclasses.replace(self, temperature=0.0)
        return dataclasses.replace(
            self, temperature=float(gc.get("temperature", 1.0)),
            top_k=self.top_k or int(gc.get("top_k", HF_DEFAULT_TOP_K)),
            top_p=float(gc["top_p"]) if self.top_p == 1.0 and "top_p" in gc else self.top_p,
            min_p=float(gc["min_p"]) if self.min_p == 0.0 and "min_p" in gc else self.min_p)

    @classmethod
    def from_generation_config(cls, generation_config: Mapping[str, Any] | None, **user: Any) -> SamplingParams:
        """Defaults from a checkpoint's generation_config.json dict; `user` values win.

        HF semantics: do_sample absent/false means greedy (temperature 0), whatever
        temperature the file holds; true means temperature from the file (default 1.0) and
        top_k from the file, else HF's implicit 50. top_p, min_p, repetition_penalty,
        max_new_tokens, num_beams, length_penalty, early_stopping are taken as written;
        max_length is ignored (it counts the prompt, unknown here). eos_token_id (int or
        list) is appended to stop_token_ids unless ignore_eos, as vLLM does: user stop ids
        add to EOS rather than replace it. A user value of None means "not given", so a CLI
        can pass its unset options straight through.
        """
        gc = {k: v for k, v in (generation_config or {}).items() if v is not None}
        user = {k: v for k, v in user.items() if v is not None}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(user) - known)
        if unknown:
            raise InputError(f"unknown sampling parameter(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")

        merged: dict[str, Any] = {}
        if gc.get("do_sample"):
            merged["temperature"] = float(gc.get("temperature", 1.0))
        else:
            merged["temperature"] = 0.0
        merged["top_k"] = int(gc.get("top_k", HF_DEFAULT_TOP_K))
        for key in ("top_p", "min_p", "repetition_penalty", "length_penalty"):
            if key in gc:
                merged[key] = float(gc[key])
        for key in ("max_new_tokens", "num_beams"):
            if key in gc:
                merged[key] = int(gc[key])
        if "early_stopping" in gc:
            # HF also allows "never" (stricter than False); we only distinguish "stop at
            # num_beams finished hypotheses" (True) from the heuristic (anything else).
            merged["early_stopping"] = gc["early_stopping"] is True
        merged.update(user)

        eos = gc.get("eos_token_id", [])
        eos = [eos] if isinstance(eos, int) else list(eos)
        if not merged.get("ignore_eos", False):
            stop_ids = list(merged.get("stop_token_ids", ()))
            merged["stop_token_ids"] = tuple(dict.fromkeys(stop_ids + [int(t) for t in eos]))
        return cls(**merged)


def _check_int(value: Any, name: str, ok: Callable[[int], bool], valid: str) -> None:
    # bool is an int subclass; `top_k=True` is a mistake, not 1
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not ok(value):
        raise InputError(f"{name} must be {valid}, got {value!r}")


def _check_num(value: Any, name: str, ok: Callable[[float], bool], valid: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
        raise InputError(f"{name} must be {valid}, got {value!r}")


def _check_bool(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be true or false, got {value!r}")
