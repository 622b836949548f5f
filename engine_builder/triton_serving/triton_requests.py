"""One Triton request -> the executor -> Triton responses, shared by the pytriton binding and the python-backend
model. Inputs and outputs are numpy arrays keyed by the names of triton_io.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from engine_builder.executor.executor import Executor
from engine_builder.executor.request import RequestFailed
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.util.errors import InputError

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class TritonGenerateRequest:
    prompt: str
    max_tokens: int
    temperature: float | None  # None = greedy
    seed: int | None
    stream: bool

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed)


def _scalar(inputs: Mapping[str, np.ndarray], name: str) -> object | None:
    value = inputs.get(name)
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise InputError(f"input {name} must hold one value, got {flat.size}; send shape [1]")
    return flat[0]


def parse_request(inputs: Mapping[str, np.ndarray]) -> TritonGenerateRequest:
    """The request's inputs checked; InputError (the client's mistake) says which input and what to send."""
    raw = _scalar(inputs, "text_input")
    if raw is None:
        raise InputError("input text_input is missing; send the prompt as BYTES, shape [1]")
    try:
        prompt = raw.decode("utf-8") if isinstance(raw, bytes | np.bytes_) else str(raw)
    except UnicodeDecodeError:
        raise InputError("input text_input is not UTF-8; send the prompt encoded as UTF-8") from None
    max_tokens = _scalar(inputs, "max_tokens")
    if max_tokens is None:
        raise InputError("input max_tokens is missing; send the most new tokens as INT32, shape [1]")
    if int(max_tokens) < 1:
        raise InputError(f"max_tokens must be at least 1, got {int(max_tokens)}")
    temperature = _scalar(inputs, "temperature")
    temperature = float(temperature) if temperature is not None and float(temperature) > 0 else None
    seed = _scalar(inputs, "random_seed")
    stream = _scalar(inputs, "stream")
    return TritonGenerateRequest(prompt, int(max_tokens), temperature, None if seed is None else int(seed),
                                 bool(stream) if stream is not None else False)


def _outputs(text: str, ids: list[int]) -> Outputs:
    return {"text_output": np.array([text.encode("utf-8")], dtype=np.object_),
            "output_ids": np.array(ids, dtype=np.int32)}


def generate_responses(executor: Executor, encode: Callable[[str], list[int]],
                       request: TritonGenerateRequest) -> Iterator[Outputs]:
    """Streaming: one response per token (its text delta and id); else one response with the whole text and
    ids. Ends when the request does; closing the iterator early (the client went away) cancels it."""
    handle = executor.submit(encode(request.prompt), request.sampling_params())  # InputError / CapacityError here
    texts: list[str] = []
    ids: list[int] = []
    try:
        for event in handle.events():
            if event.finish_reason == "error":
                raise RequestFailed(event.error or "the executor failed this request")
            new_ids = [] if event.token_id is None else [event.token_id]
            if request.stream:
                if event.text or new_ids:
                    yield _outputs(event.text, new_ids)
            else:
                texts.append(event.text)
                ids.extend(new_ids)
    finally:
        handle.cancel()  # a no-op once finished
    if not request.stream:
        yield _outputs("".join(texts), ids)
