"""Normalizing and checking the SamplingParams fields of structured output and logit_bias (kept out of
sampling_params.py so that file stays about the classic sampling knobs).

    json_schema  a JSON schema (dict or JSON text), stored as canonical JSON text (hashable)
    regex        the output matches this regular expression (llguidance's Rust regex syntax)
    choice       the output is exactly one of these strings
    logit_bias   {token_id: bias in [-100, 100]} added to the logits before sampling (OpenAI)
    prompt_logprobs  n: every prompt token's logprob + the top n (runner/prompt_logprobs.py)

At most one of json_schema / regex / choice: each is a whole-output grammar.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from engine_builder.runner.grammar import canonical_schema
from engine_builder.util.errors import InputError


def normalize_extras(params: Any) -> None:
    """Called from SamplingParams.__post_init__: dicts and lists become hashable, values are checked."""
    def put(name: str, value: Any) -> None:
        object.__setattr__(params, name, value)

    if params.json_schema is not None:
        put("json_schema", canonical_schema(params.json_schema))
    if params.regex is not None and (not isinstance(params.regex, str) or not params.regex):
        raise InputError(f"regex must be a non-empty string, got {params.regex!r}")
    if params.choice is not None:
        choice = (params.choice,) if isinstance(params.choice, str) else params.choice
        try:
            choice = tuple(choice)
        except TypeError:
            raise InputError(f"choice must be a list of strings, got {params.choice!r}") from None
        if not choice or not all(isinstance(c, str) and c for c in choice):
            raise InputError(f"choice must be a non-empty list of non-empty strings, got {params.choice!r}")
        put("choice", choice)
    given = [n for n in ("json_schema", "regex", "choice") if getattr(params, n) is not None]
    if len(given) > 1:
        raise InputError(f"give at most one of json_schema, regex, choice; got {', '.join(given)}")
    if given and params.num_beams > 1:
        raise InputError(f"{given[0]} cannot be combined with beam search (num_beams {params.num_beams})")
    if params.logit_bias is not None:
        put("logit_bias", _logit_bias(params.logit_bias))
    p = params.prompt_logprobs
    if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Integral) or p < 0):
        raise InputError(f"prompt_logprobs must be None (off) or an integer >= 0 (top alternatives), got {p!r}")


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    out: dict[int, float] = {}
    try:
        for token, bias in items:
            if isinstance(token, str) and token.strip().lstrip("-").isdigit():
                token = int(token)  # JSON object keys are strings: {"50256": -100}
            if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
                raise InputError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias) \
                    or not -100 <= bias <= 100:
                raise InputError(f"logit_bias values must be numbers in [-100, 100], got {bias!r}")
            out[int(token)] = float(bias)
    except (TypeError, ValueError):
        raise InputError(f"logit_bias must map token ids to biases, got {value!r}") from None
    return tuple(sorted(out.items()))
