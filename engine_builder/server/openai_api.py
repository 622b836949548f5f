"""OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions (each streaming or not),
GET /v1/models.

Defaults a request leaves out, decided on purpose:
  temperature, top_p, top_k ... the model's generation_config.json (LLM.default_params), as vLLM
      does by default and as `trtbuild run` does; not OpenAI's temperature 1.0. SmolLM2 has no
      do_sample there, so it decodes greedily unless the request sets a temperature.
  max_tokens  /v1/completions: 16 (OpenAI's documented default); /v1/chat/completions: all the room
      max_total_tokens leaves after the prompt (as OpenAI and vLLM do for chat).
Chat messages go through the tokenizer's chat template (the "developer" role, OpenAI's new name
for "system", is passed on as "system", which every template knows); special tokens' text inside them
stays text (chat_tokens.py) unless the server runs with --parse-chat-special-tokens. A /v1/completions
prompt is raw: special tokens in it are parsed, so a client can write a template's markers itself.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request

from engine_builder.runner.outputs import RequestOutput
from engine_builder.runner.sampler import TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.server import tool_calls
from engine_builder.server.generation import (
    ActiveRequest,
    EventStream,
    ServerState,
    admit,
    check_capacity,
    check_lengths,
    check_stop,
    check_top_logprobs,
    clamp_top_k,
    failed_sse,
    image_token_text,
    max_new_tokens,
    off_loop,
    server_state,
    sse,
    with_images,
)
from engine_builder.server.http_errors import MODEL_NOT_FOUND, VALIDATION, ApiError
from engine_builder.server.openai_choices import admit_n, check_n, interleaved, n_outputs, usage
from engine_builder.server.openai_schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from engine_builder.server.structured_output import check_constraint, openai_constraint

COMPLETIONS_DEFAULT_MAX_TOKENS = 16

router = APIRouter(prefix="/v1", tags=["OpenAI"])


def _check_request(state: ServerState, body: SamplingFields) -> None:
    if body.model is not None and body.model != state.config.model_name:
        raise ApiError(MODEL_NOT_FOUND, f"model {body.model!r} does not exist on this server; it serves "
                                        f"{state.config.model_name!r} (see GET /v1/models)")
    check_n(body.n)
    if body.stream_options is not None and not body.stream:
        raise ApiError(VALIDATION, "stream_options is only allowed with stream: true")
    check_stop(state.config, body.stop)


async def _sampling(state: ServerState, body: SamplingFields, prompt_len: int, new_tokens: int, field: str,
                    logprobs: int | None, tool_constraint: dict[str, Any] | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The request's SamplingParams, its constraint compiled (after the length checks: no compile for a
    request that is refused anyway)."""
    check_lengths(state.config, prompt_len, new_tokens, field)
    constraint = openai_constraint(body)
    if tool_constraint and constraint:
        raise ApiError(VALIDATION, "response_format cannot be combined with tool_choice required or a named "
                                   "function (the tool's schema already constrains the output)")
    constraint = tool_constraint or constraint
    # stop: a string or a list, as OpenAI allows; SamplingParams takes both ("" is refused as [""] is)
    params = state.executor.llm.default_params(
        max_new_tokens=new_tokens, temperature=body.temperature, top_p=body.top_p, top_k=clamp_top_k(state, body.top_k),
        min_p=body.min_p, repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, seed=body.seed, stop=body.stop, logprobs=logprobs,
        logit_bias=body.logit_bias, prompt_logprobs=prompt_logprobs, priority=body.priority, **constraint)
    vocab = state.executor.llm.backend.vocab_size
    bad = next((t for t, _ in params.logit_bias or () if t >= vocab), None)
    if bad is not None:  # SamplingState refuses it too; here before the constraint compiles
        raise ApiError(VALIDATION, f"logit_bias token ids must be in [0, {vocab}), got {bad}")
    await check_constraint(state, params)
    return params


def _envelope(kind: str, model: str) -> Callable[..., dict[str, Any]]:
    """Response objects of one request: the same id and created on every chunk."""
    rid, created = f"{'chatcmpl' if 'chat' in kind else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())

    def make(**fields: Any) -> dict[str, Any]:
        return {"id": rid, "object": kind, "created": created, "model": model, **fields}

    return make


def _usage(active: ActiveRequest) -> dict[str, int]:
    return usage([active])


Choice = Callable[[str, TokenLogprobs | None, str | None], dict[str, Any]]


def _stream(actives: list[ActiveRequest], body: SamplingFields, make: Callable[..., dict[str, Any]],
            choices: list[Choice], first: dict[str, Any] | None = None) -> EventStream:
    """SSE chunks: one per token event of any choice (tagged with its index; n > 1 interleaves them),
    finish_reason on each choice's last; then usage if asked; then [DONE]. `first`: a chunk every choice
    opens with (its index set here). A choice that fails ends the whole stream with the error event."""
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    extra = {"usage": None} if include_usage else {}

    async def chunks() -> AsyncIterator[str]:
        if first is not None:
            for index in range(len(actives)):
                yield sse(make(choices=[{**first, "index": index}], **extra))
        async for index, event in interleaved(actives):
            if event.token_id is None:  # cancelled, failed or timed out
                yield failed_sse(True, actives[index])
                yield sse("[DONE]")
                return
            chunk = choices[index](event.text, event.logprob, event.finish_reason)
            yield sse(make(choices=[{**chunk, "index": index}], **extra))
        if include_usage:
            yield sse(make(choices=[], usage=usage(actives)))
        yield sse("[DONE]")

    def close(disconnected: bool) -> None:
        for active in actives:
            active.close(disconnected)

    return EventStream(chunks(), on_close=close, openai=True)


# --- /v1/completions ------------------------------------------------------------------------------

async def _completion_prompt(state: ServerState,
                             prompt: str | list[str] | list[int]) -> tuple[str | None, list[int]]:
    if isinstance(prompt, str):
        return prompt, await off_loop(state.executor.llm.encode, prompt)
    if prompt and all(isinstance(p, int) for p in prompt):
        vocab = state.executor.llm.backend.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:  # checked here: a negative id fails deep in the detokenizer otherwise (a 500)
            raise ApiError(VALIDATION, f"prompt token ids must be in [0, {vocab}), got {bad}")
        return None, list(prompt)
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], await off_loop(state.executor.llm.encode, prompt[0])
    if len(prompt) == 1 and isinstance(prompt[0], list):  # [[ids]]: lm-eval's local-completions, batch size 1
        return await _completion_prompt(state, prompt[0])
    raise ApiError(VALIDATION, "prompt must be one prompt: a string, a list of one string, or a list of token ids; "
                               "send one request per prompt")


class _CompletionLogprobs:
    """OpenAI's legacy completions logprobs: parallel lists, text_offset into the returned text."""

    def __init__(self, state: ServerState, offset: int) -> None:
        self._state, self._offset = state, offset

    def __call__(self, lps: list[TokenLogprobs], prompt: tuple[list[int], list[TokenLogprobs | None]] | None = None
                 ) -> dict[str, Any]:
        """The generated tokens' lists; with `prompt` (echo: its ids and their logprobs) those come first,
        null for the first prompt token as OpenAI returns it."""
        texts = self._state.token_texts
        pairs: list[tuple[int, TokenLogprobs | None]] = list(zip(*prompt)) if prompt else []
        pairs += [(lp.token_id, lp) for lp in lps]
        tokens, offsets = [], []
        for token_id, _ in pairs:
            tokens.append(texts(token_id))
            offsets.append(self._offset)
            self._offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp.logprob if lp else None for _, lp in pairs],
                "top_logprobs": [{texts(t): v for t, v in lp.top} if lp else None for _, lp in pairs],
                "text_offset": offsets}


@router.post("/completions", summary="Text completion (OpenAI)")
async def completions(request: Request, body: CompletionRequest, state: ServerState = Depends(server_state)) -> Any:
    _check_request(state, body)
    check_top_logprobs(state.config, body.logprobs, "logprobs")
    check_capacity(state)
    if body.suffix is not None:
        raise ApiError(VALIDATION, "suffix (text insertion) is not supported by this model server; put all the "
                                   "text in prompt and leave suffix out")
    scored = body.echo and body.logprobs is not None  # the prompt's own logprobs (lm-eval's loglikelihood)
    if scored and body.stream:
        raise ApiError(VALIDATION, "echo with logprobs is not streamed by this server; send stream: false")
    text, ids = await _completion_prompt(state, body.prompt)
    new_tokens = max_new_tokens(state, len(ids), body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, "max_tokens")
    params = await _sampling(state, body, len(ids), new_tokens, "max_tokens", body.logprobs,
                             prompt_logprobs=body.logprobs if scored else None)
    echo = (text if text is not None else await off_loop(state.executor.llm.tokenizer.decode, ids)) if body.echo \
        else ""
    make = _envelope("text_completion", state.config.model_name)

    def whole(index: int, out: RequestOutput) -> dict[str, Any]:
        lps = _CompletionLogprobs(state, 0 if scored else len(echo)) if body.logprobs is not None else None
        return {"index": index, "text": echo + out.text,
                "logprobs": lps(list(out.logprobs), (ids, list(out.prompt_logprobs)) if scored else None)
                if lps and out.logprobs is not None else None, "finish_reason": out.finish_reason}

    if body.n > 1 and not body.stream:
        outs, n_usage = await n_outputs(state, request, ids, params, "max_tokens", body.n)
        return make(choices=[whole(i, out) for i, out in enumerate(outs)], usage=n_usage)

    def streamed_choice() -> Choice:
        logprobs = _CompletionLogprobs(state, len(echo)) if body.logprobs is not None else None

        def choice(delta: str, lp: TokenLogprobs | None, finish_reason: str | None) -> dict[str, Any]:
            return {"index": 0, "text": delta, "logprobs": logprobs([lp]) if logprobs and lp else None,
                    "finish_reason": finish_reason}

        return choice

    if body.stream:  # no await from here to the response: an admitted request is always closed by it
        first = {"index": 0, "text": echo, "logprobs": None, "finish_reason": None} if echo else None
        actives = admit_n(state, ids, params, "max_tokens", body.n)
        return _stream(actives, body, make, [streamed_choice() for _ in actives], first)
    active = admit(state, ids, params, "max_tokens")
    out = await active.output(request)
    return make(choices=[whole(0, out)], usage=_usage(active))


# --- /v1/chat/completions -------------------------------------------------------------------------

def _chat_logprobs(state: ServerState, lps: list[TokenLogprobs]) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = state.token_texts(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in lps], "refusal": None}


@router.post("/chat/completions", summary="Chat completion (OpenAI)")
async def chat_completions(request: Request, body: ChatCompletionRequest,
                           state: ServerState = Depends(server_state)) -> Any:
    _check_request(state, body)
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise ApiError(VALIDATION, "give max_completion_tokens or max_tokens, not both")
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(VALIDATION, "top_logprobs needs logprobs: true")
    check_top_logprobs(state.config, body.top_logprobs, "top_logprobs")
    check_capacity(state)
    tool_plan = tool_calls.plan(body.tools, body.tool_choice, body.parallel_tool_calls)
    messages, tools = tool_calls.render(body.messages, tool_plan,
                                        tool_calls.template_knows_tools(state.executor.llm.tokenizer))
    images = [url for m in body.messages for url in m.images()]
    ids = await off_loop(state.chat_tokens.encode, messages, tools, image_token_text(state) if images else None)
    ids, image = await with_images(state, ids, images)
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    field = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    new_tokens = max_new_tokens(state, len(ids), requested, None, field)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = await _sampling(state, body, len(ids), new_tokens, field, logprobs, tool_plan.constraint())

    def whole(index: int, out: RequestOutput) -> dict[str, Any]:
        content, calls = tool_calls.parse(out.text, tool_plan)
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        return {"index": index, "message": message,
                "logprobs": _chat_logprobs(state, list(out.logprobs)) if out.logprobs else None,
                "finish_reason": "tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason}

    if body.n > 1 and not body.stream:
        outs, n_usage = await n_outputs(state, request, ids, params, field, body.n, image)
        make = _envelope("chat.completion", state.config.model_name)
        return make(choices=[whole(i, out) for i, out in enumerate(outs)], usage=n_usage)
    if body.stream:
        make = _envelope("chat.completion.chunk", state.config.model_name)
        actives = admit_n(state, ids, params, field, body.n, image)
        choices: list[Choice] = [tool_calls.StreamedChoice(tool_plan, lambda lp: _chat_logprobs(state, [lp]))
                                 for _ in actives]
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return _stream(actives, body, make, choices, first)
    active = admit(state, ids, params, field, image)
    out = await active.output(request)
    make = _envelope("chat.completion", state.config.model_name)
    return make(choices=[whole(0, out)], usage=_usage(active))


# --- /v1/models -----------------------------------------------------------------------------------

def _model_card(state: ServerState, request: Request) -> dict[str, Any]:
    return {"id": state.config.model_name, "object": "model", "created": request.app.state.started,
            "owned_by": "trtbuild", "max_model_len": state.config.max_total_tokens}


@router.get("/models", summary="The model this server serves (OpenAI)")
async def models(request: Request, state: ServerState = Depends(server_state)) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(state, request)]}


@router.get("/models/{model}", summary="One model (OpenAI)")
async def model(model: str, request: Request, state: ServerState = Depends(server_state)) -> dict[str, Any]:
    if model != state.config.model_name:
        raise ApiError(MODEL_NOT_FOUND, f"model {model!r} does not exist on this server; it serves "
                                        f"{state.config.model_name!r}")
    return _model_card(state, request)
