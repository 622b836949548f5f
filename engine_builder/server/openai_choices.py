"""OpenAI's n: several choices for one prompt, each its own request in the executor (so they decode
in one batch). Choice i > 0 of a seeded request gets seed + i, so the choices differ yet replay; a
greedy request's choices are identical, as in vLLM.

Streamed, the choices' chunks interleave in the order their tokens come, each chunk carrying one
choice tagged with its `index`, as OpenAI streams n > 1 (`interleaved`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from fastapi import Request

from engine_builder.executor import TokenEvent
from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.outputs import RequestOutput
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.server.generation import ActiveRequest, ServerState, admit
from engine_builder.server.http_errors import VALIDATION, ApiError

MAX_N = 16


def check_n(n: int) -> None:
    if not 1 <= n <= MAX_N:
        raise ApiError(VALIDATION, f"n must be in [1, {MAX_N}], got {n}")


def admit_n(state: ServerState, ids: Sequence[int], params: SamplingParams, new_tokens_field: str,
            n: int, image: ImagePrompt | None = None) -> list[ActiveRequest]:
    """n requests for one prompt, all admitted or none (an admitted one is closed if a later one fails)."""
    actives: list[ActiveRequest] = []
    try:
        for i in range(n):
            seeded = params if i == 0 or params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            actives.append(admit(state, ids, seeded, new_tokens_field, image))
    except BaseException:
        for a in actives:
            a.close()
        raise
    return actives


def usage(actives: Sequence[ActiveRequest]) -> dict[str, int]:
    """The prompt counted once, the completions of every choice summed, as OpenAI counts n > 1."""
    prompt, completion = actives[0].prompt_tokens, sum(a.completion_tokens for a in actives)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def n_outputs(state: ServerState, request: Request, ids: Sequence[int], params: SamplingParams,
                    new_tokens_field: str, n: int, image: ImagePrompt | None = None
                    ) -> tuple[list[RequestOutput], dict[str, int]]:
    """Each choice's output, and the usage of them all."""
    actives = admit_n(state, ids, params, new_tokens_field, n, image)
    outputs = await asyncio.gather(*(a.output(request) for a in actives))
    return list(outputs), usage(actives)


async def interleaved(actives: Sequence[ActiveRequest]) -> AsyncIterator[tuple[int, TokenEvent]]:
    """(choice index, event) of every request as each comes; ends when all have ended. A failure of the
    relay itself (a bug) is raised here, not lost in a task."""
    if len(actives) == 1:
        async for event in actives[0].events():
            yield 0, event
        return
    queue: asyncio.Queue[tuple[int, TokenEvent | Exception | None]] = asyncio.Queue()

    async def relay(index: int, active: ActiveRequest) -> None:
        try:
            async for event in active.events():
                await queue.put((index, event))
        except Exception as exc:  # noqa: BLE001  (re-raised by the consumer below)
            await queue.put((index, exc))
            return
        await queue.put((index, None))

    tasks = [asyncio.ensure_future(relay(i, a)) for i, a in enumerate(actives)]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if item is None:
                left -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
