"""OpenAI's n: several choices for one prompt, each its own request in the executor (so they decode
in one batch). Choice i > 0 of a seeded request gets seed + i, so the choices differ yet replay; a
greedy request's choices are identical, as in vLLM. Not streamed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from fastapi import Request

from engine_builder.runner.llm import RequestOutput
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.server.generation import ActiveRequest, ServerState, admit
from engine_builder.server.http_errors import VALIDATION, ApiError

MAX_N = 16


def check_n(n: int, stream: bool) -> None:
    if not 1 <= n <= MAX_N:
        raise ApiError(VALIDATION, f"n must be in [1, {MAX_N}], got {n}")
    if n > 1 and stream:
        raise ApiError(VALIDATION, "n > 1 is not streamed by this server; send stream: false, or one streamed "
                                   "request per choice")


async def n_outputs(state: ServerState, request: Request, ids: Sequence[int], params: SamplingParams,
                    new_tokens_field: str, n: int) -> tuple[list[RequestOutput], dict[str, int]]:
    """Each choice's output, and the usage of them all (the prompt counted once, as OpenAI does)."""
    actives: list[ActiveRequest] = []
    try:
        for i in range(n):
            seeded = params if i == 0 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            actives.append(admit(state, ids, seeded, new_tokens_field))
    except BaseException:
        for a in actives:
            a.close()
        raise
    outputs = await asyncio.gather(*(a.output(request) for a in actives))
    completion = sum(a.completion_tokens for a in actives)
    return list(outputs), {"prompt_tokens": len(ids), "completion_tokens": completion,
                           "total_tokens": len(ids) + completion}
