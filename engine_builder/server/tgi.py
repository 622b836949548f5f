"""Text Generation Inference (TGI) routes: POST /generate, /generate_stream, and / (which
huggingface_hub.InferenceClient(base_url).text_generation posts to, with "stream" in the body).

Sampling follows TGI, not the model's generation_config: greedy unless do_sample is true or a
warper is set (temperature != 1, top_k > 0, top_p < 1); a sampled request without a seed gets a
random one, reported in details.seed so it can be replayed. max_new_tokens defaults to 100 (TGI's
router default), less when max_total_tokens leaves less room. temperature 0 means greedy (TGI
refuses it; accepting it costs nothing).

best_of > 1 (non-streamed, sampled, without a seed: TGI's rules) runs best_of sequences in one batch,
each with its own random seed, and answers the one whose tokens' logprobs sum highest; with details,
details.best_of_sequences holds the others, as TGI returns them. At most MAX_BEST_OF (OpenAI's n cap).

One deliberate difference from TGI: a streamed token's `text` is the text that token adds to
generated_text (an EOS token adds ""), so concatenating the streamed texts always gives
generated_text; TGI sends the special token's own text ("</s>") there.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from engine_builder.runner.outputs import RequestOutput
from engine_builder.runner.sampler import TokenLogprobs
from engine_builder.runner.sampling_params import SamplingParams
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
from engine_builder.server.http_errors import VALIDATION, ApiError
from engine_builder.server.openai_choices import MAX_N, admit_n
from engine_builder.server.schema_types import Text
from engine_builder.server.structured_output import TgiGrammar, check_constraint, tgi_constraint

TGI_DEFAULT_MAX_NEW_TOKENS = 100
MAX_BEST_OF = MAX_N

router = APIRouter(tags=["TGI"])


class TgiParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[Text] = Field(default_factory=list)
    details: bool = False
    do_sample: bool = False
    return_full_text: bool | None = None
    top_n_tokens: int | None = Field(None, ge=0, description="alternatives per token (at most the server's "
                                                             "--max-top-logprobs, 20 by default)")
    truncate: int | None = Field(None, ge=1, description="keep only the last N prompt tokens")
    decoder_input_details: bool = False
    best_of: int | None = Field(None, ge=1, description=f"sample this many sequences, answer the likeliest "
                                                       f"(needs sampling, no seed, no stream; at most {MAX_BEST_OF})")
    # TGI features this server does not have: accepted in the schema, refused unless neutral
    typical_p: float | None = None
    watermark: bool = False
    grammar: TgiGrammar | None = None  # json schema or regex (server/structured_output.py)
    adapter_id: Text | None = None


class TgiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Text
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: bool = False  # only read by POST /


def _refuse_unsupported(p: TgiParameters) -> None:
    unsupported = {"typical_p": p.typical_p not in (None, 1.0),
                   "watermark": p.watermark, "adapter_id": p.adapter_id is not None,
                   "decoder_input_details": p.decoder_input_details}
    names = [k for k, v in unsupported.items() if v]
    if names:
        raise ApiError(VALIDATION, f"parameters {', '.join(names)} are not supported by this server; leave them out")


def _sampled(p: TgiParameters) -> bool:
    return p.do_sample or p.temperature not in (None, 1.0) or (p.top_k or 0) > 0 or p.top_p not in (None, 1.0)


def _check_best_of(p: TgiParameters, stream: bool) -> None:
    """TGI's own rules for best_of, with its messages' sense."""
    if (p.best_of or 1) == 1:
        return
    if p.best_of > MAX_BEST_OF:
        raise ApiError(VALIDATION, f"best_of must be at most {MAX_BEST_OF}, got {p.best_of}")
    if stream:
        raise ApiError(VALIDATION, "best_of > 1 is not supported when streaming tokens; send it to /generate")
    if not _sampled(p):
        raise ApiError(VALIDATION, "best_of > 1 needs sampling (do_sample: true, or a temperature, top_k or top_p); "
                                   "greedy sequences would all be the same")
    if p.seed is not None:
        raise ApiError(VALIDATION, "seed must not be set when best_of > 1 (each sequence gets its own, reported in "
                                   "details); leave seed out")


def _sampling(state: ServerState, p: TgiParameters, prompt_len: int, stream: bool) -> SamplingParams:
    sample = _sampled(p)
    seed = p.seed if p.seed is not None or not sample else random.getrandbits(63)
    # a streamed token always carries its logprob; best_of ranks sequences by theirs
    want_logprobs = p.details or stream or p.top_n_tokens or (p.best_of or 1) > 1
    return state.executor.llm.default_params(
        max_new_tokens=max_new_tokens(state, prompt_len, p.max_new_tokens, TGI_DEFAULT_MAX_NEW_TOKENS,
                                      "max_new_tokens"),
        temperature=(1.0 if p.temperature is None else p.temperature) if sample else 0.0,
        # TGI's neutral values, not the model's
        top_k=clamp_top_k(state, p.top_k or 0), top_p=1.0 if p.top_p is None else p.top_p,
        repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty, seed=seed,
        stop=p.stop, logprobs=(p.top_n_tokens or 0) if want_logprobs else None, **tgi_constraint(p.grammar))


async def _start(state: ServerState, body: TgiRequest, stream: bool) -> list[ActiveRequest]:
    """The request admitted: one sequence, or best_of of them."""
    p = body.parameters
    _refuse_unsupported(p)
    _check_best_of(p, stream)
    check_top_logprobs(state.config, p.top_n_tokens, "top_n_tokens")
    check_stop(state.config, p.stop)
    check_capacity(state)
    inputs, images = _markdown_images(state, body.inputs)
    ids = await off_loop(state.executor.llm.encode, inputs)
    if p.truncate is not None:
        ids = ids[-p.truncate:]
    ids, image = await with_images(state, ids, images)
    params = _sampling(state, p, len(ids), stream)
    check_lengths(state.config, len(ids), params.max_new_tokens, "max_new_tokens")  # before any compile
    await check_constraint(state, params)
    if (p.best_of or 1) > 1:
        return admit_n(state, ids, params, "max_new_tokens", p.best_of, image)
    return [admit(state, ids, params, "max_new_tokens", image)]


MARKDOWN_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")  # TGI's image input: ![](data:image/png;base64,...)


def _markdown_images(state: ServerState, inputs: str) -> tuple[str, list[str]]:
    """A vision-language model's inputs with each markdown image replaced by its image token, and their URLs in
    order (TGI's multimodal inputs); a text-only model's inputs as they are."""
    token = image_token_text(state)
    if token is None:
        return inputs, []
    urls = MARKDOWN_IMAGE.findall(inputs)
    return (MARKDOWN_IMAGE.sub(lambda _: token, inputs) if urls else inputs), urls


def _token(state: ServerState, token_id: int, logprob: float | None, text: str | None = None) -> dict[str, Any]:
    return {"id": token_id, "text": state.token_texts(token_id) if text is None else text,
            "logprob": logprob, "special": token_id in state.token_texts.special_ids}


def _top_tokens(state: ServerState, lp: TokenLogprobs | None) -> list[dict[str, Any]]:
    return [_token(state, t, v) for t, v in lp.top] if lp is not None else []


def _finish_reason(out: RequestOutput) -> str:
    if out.finish_reason == "length":
        return "length"
    return "stop_sequence" if isinstance(out.stop_reason, str) else "eos_token"


def _generated_text(body: TgiRequest, text: str) -> str:
    return body.inputs + text if body.parameters.return_full_text else text


def _details(state: ServerState, body: TgiRequest, active: ActiveRequest, out: RequestOutput) -> dict[str, Any]:
    lps = out.logprobs or (None,) * len(out.token_ids)
    details: dict[str, Any] = {
        "finish_reason": _finish_reason(out), "generated_tokens": len(out.token_ids),
        "seed": active.handle.params.seed, "prefill": [],
        "tokens": [_token(state, t, lp.logprob if lp else None) for t, lp in zip(out.token_ids, lps)]}
    if body.parameters.top_n_tokens:
        details["top_tokens"] = [_top_tokens(state, lp) for lp in lps]
    return details


def _logprob_sum(out: RequestOutput) -> float:
    return sum(lp.logprob for lp in out.logprobs or ())


async def _generate(request: Request, body: TgiRequest, state: ServerState) -> dict[str, Any]:
    actives = await _start(state, body, stream=False)
    outs = list(await asyncio.gather(*(a.output(request) for a in actives)))
    # best_of: the likeliest sequence first (ties: the earlier one), the others after it
    order = sorted(range(len(outs)), key=lambda i: -_logprob_sum(outs[i]))
    best, out = actives[order[0]], outs[order[0]]
    result: dict[str, Any] = {"generated_text": _generated_text(body, out.text)}
    if body.parameters.details:
        result["details"] = _details(state, body, best, out)
        if len(outs) > 1:
            result["details"]["best_of_sequences"] = [
                {"generated_text": _generated_text(body, outs[i].text), **_details(state, body, actives[i], outs[i])}
                for i in order[1:]]
    return result


async def _generate_stream(body: TgiRequest, state: ServerState) -> EventStream:
    active, = await _start(state, body, stream=True)

    async def events() -> AsyncIterator[str]:
        index = 0
        async for event in active.events():
            if event.token_id is None:  # cancelled, failed or timed out: TGI's error event ends the stream
                yield failed_sse(False, active)
                return
            index += 1
            lp = event.logprob
            chunk: dict[str, Any] = {
                "index": index, "token": _token(state, event.token_id, lp.logprob if lp else None, event.text),
                "top_tokens": _top_tokens(state, lp) if body.parameters.top_n_tokens else None,
                "generated_text": None, "details": None}
            if event.finished:
                out = active.handle.result()
                chunk["generated_text"] = _generated_text(body, out.text)
                chunk["details"] = {"finish_reason": _finish_reason(out), "generated_tokens": len(out.token_ids),
                                    "seed": active.handle.params.seed, "input_length": active.prompt_tokens}
            yield sse(chunk)

    return EventStream(events(), on_close=active.close, openai=False)


@router.post("/generate", summary="Generate text (TGI)")
async def generate(request: Request, body: TgiRequest, state: ServerState = Depends(server_state)) -> dict[str, Any]:
    return await _generate(request, body, state)


@router.post("/generate_stream", summary="Generate text, streamed as server-sent events (TGI)")
async def generate_stream(body: TgiRequest, state: ServerState = Depends(server_state)) -> EventStream:
    return await _generate_stream(body, state)


@router.post("/", summary="TGI's compat route: /generate or /generate_stream, by the body's `stream`")
async def compat_generate(request: Request, body: TgiRequest,
                          state: ServerState = Depends(server_state)) -> Any:
    if body.stream:
        return await _generate_stream(body, state)
    return await _generate(request, body, state)
