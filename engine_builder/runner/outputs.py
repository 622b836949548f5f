"""What a request gives back: RequestOutput (one finished request), TokenStream (its text deltas as they come).

    outs = llm.generate(["The capital of France is"])      # list[RequestOutput], in prompt order
    print(outs[0].text, outs[0].finish_reason)
    with llm.stream("Once upon a time") as stream:         # a TokenStream
        for delta in stream: print(delta, end="")
    print(stream.output.finish_reason, stream.timings.decode_tok_s)

request_output() turns the loop's RequestState (runner/request_state.py) into the RequestOutput users see.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine_builder.runner.grammar import Constraint, first_line
from engine_builder.runner.request_state import Event, RequestState, Timings
from engine_builder.runner.sampler import TokenLogprobs

if TYPE_CHECKING:
    from engine_builder.runner.generate import Generator

__all__ = ["RequestOutput", "TokenStream", "request_output"]


@dataclass(frozen=True)
class RequestOutput:
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    text: str  # generated text; a stop string and the stop token's text are not included
    token_ids: tuple[int, ...]  # generated only; the stop token that ended the request is included (vLLM)
    # "stop" (EOS, stop token or stop string), "length" (max_new_tokens), or "error": a json_schema / regex / choice
    # answer the grammar engine gave up on mid-way (it then allows only EOS), with stop_reason saying why
    finish_reason: str
    stop_reason: int | str | None  # the stop string or stop_token_ids entry that matched; None for EOS/length
    logprobs: tuple[TokenLogprobs, ...] | None  # one per token_ids entry when params.logprobs is set
    # one per prompt token (None for the first) when params.prompt_logprobs is set
    prompt_logprobs: tuple[TokenLogprobs | None, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "token_ids": list(self.token_ids),
                               "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}
        if self.logprobs is not None:
            out["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob, "rank": lp.rank,
                                "top": [[t, v] for t, v in lp.top]} for lp in self.logprobs]
        return out


def request_output(r: RequestState, prompt: str | None) -> RequestOutput:
    """The finished request R as its RequestOutput (PROMPT: its text, None when it was given as token ids)."""
    reason, why = r.finish_reason or "length", r.stop_reason
    grammar = r.sampling.grammar
    if reason == "stop" and grammar is not None and grammar.error is not None:
        # llguidance gave up mid-answer and then allowed only EOS: never an invalid answer reported as finished
        kind = Constraint.of(r.params).kind
        reason, why = "error", f"the grammar engine gave up on this {kind} mid-answer ({first_line(grammar.error)})"
    return RequestOutput(prompt, tuple(r.prompt_ids), r.text, tuple(r.token_ids), reason,
                         why, tuple(r.logprobs) if r.logprobs is not None else None,
                         tuple(r.prompt_logprobs) if r.prompt_logprobs is not None else None)


class TokenStream:
    """Text deltas of one request as they are generated; `.output` and `.timings` once it ends.
    Closing it early (or leaving a for loop with break) stops generation and frees the KV slot."""

    def __init__(self, generator: Generator, started: tuple[list[RequestState], Iterator[Event]],
                 prompt: str | None) -> None:
        self._generator, self._prompt = generator, prompt
        (self._request,), self._events = started
        self.output: RequestOutput | None = None
        self.timings: Timings | None = None

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> str:
        for event in self._events:
            if event.text:
                return event.text
        self._finish()
        raise StopIteration

    def _finish(self) -> None:
        if self.output is None:
            self.output = request_output(self._request, self._prompt)
            self.timings = self._generator.timings

    def close(self) -> None:
        self._events.close()  # runs the loop's cleanup: slots freed

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
