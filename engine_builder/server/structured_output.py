"""Structured output on the HTTP routes: OpenAI's response_format, vLLM's guided_* extensions and
TGI's grammar parameter, each turned into the SamplingParams constraint fields (json_schema, regex,
choice) that runner/grammar.py enforces with a token mask per step.

    response_format {"type": "text"}                           no constraint
                    {"type": "json_object"}                    any JSON object
                    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
                                                               the schema (enforced whether strict or not)
    guided_json / guided_regex / guided_choice                 vLLM's names, same meaning
    TGI grammar     {"type": "json", "value": schema} | {"type": "regex", "value": "..."}

A schema keyword the grammar engine cannot enforce is refused with a 400 naming it (the compile
happens here, before admission, and is cached), never answered unconstrained. So is a constraint over
the grammar limits (runner/grammar.py GrammarLimits: its size, an anyOf's branches, its compile time).
The compile runs in the grammar compiler's worker thread, after the request's cheap checks (prompt
length included), so no schema holds the event loop: /health answers while one compiles.

A constrained answer that ends on a stop token is replayed through its grammar (grammar_verdict) before
its end is reported: if llguidance gave up mid-answer (it then allows only EOS), the request ends as an
error naming why, never as a "stop" whose text fails the schema.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_builder.runner.grammar import Constraint
from engine_builder.server.http_errors import BAD_REQUEST, OVERLOADED, VALIDATION, ApiError
from engine_builder.server.schema_types import Text
from engine_builder.util.errors import InputError, UnsupportedError

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: Text | None = None
    description: Text | None = None
    # "schema" shadows a BaseModel attribute in pydantic; the alias keeps the wire name
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class TgiGrammar(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["json", "regex"]
    value: dict[str, Any] | Text


def openai_constraint(body: Any) -> dict[str, Any]:
    """SamplingParams keywords for a chat or completion body's response_format / guided_* fields."""
    fields: dict[str, Any] = {}
    fmt: ResponseFormat | None = getattr(body, "response_format", None)
    if fmt is not None and fmt.type == "json_object":
        fields["json_schema"] = JSON_OBJECT_SCHEMA
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(VALIDATION, 'response_format.json_schema.schema is required with type "json_schema"; '
                                       'give {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}')
        fields["json_schema"] = fmt.json_schema.schema_
    for name, key in (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice")):
        value = getattr(body, name, None)
        if value is not None:
            if key in fields or len(fields):
                raise ApiError(VALIDATION, f"give one of response_format, guided_json, guided_regex, guided_choice; "
                                           f"{name} came with another")
            fields[key] = value
    return fields


def tgi_constraint(grammar: TgiGrammar | None) -> dict[str, Any]:
    if grammar is None:
        return {}
    if grammar.type == "json":
        return {"json_schema": grammar.value}
    if not isinstance(grammar.value, str):
        raise ApiError(VALIDATION, "parameters.grammar.value must be a regex string with type \"regex\"")
    return {"regex": grammar.value}


async def check_constraint(state: Any, params: Any) -> None:
    """Compile the request's constraint now (cached), in the compile worker, so a bad one is a 400
    before admission and a slow one never holds the event loop."""
    if Constraint.of(params) is None:
        return
    grammars = state.executor.llm.generator.grammars
    try:
        future = grammars.submit(params)  # the size bounds raise here, before any compile
        await asyncio.wait_for(asyncio.wrap_future(future), grammars.limits.compile_timeout_s)
    except TimeoutError:
        if future.cancel():  # still queued behind other compiles: the server is busy, not the schema bad
            raise ApiError(OVERLOADED, "the grammar compiler is busy with other schemas; retry later") from None
        limit = grammars.limits.compile_timeout_s
        raise ApiError(BAD_REQUEST, f"the constraint took longer than {limit:g} s to compile (the grammar limit "
                                    "compile_timeout_s); simplify it") from None
    except (UnsupportedError, InputError) as exc:
        raise ApiError(BAD_REQUEST, str(exc)) from None


async def grammar_verdict(state: Any, params: Any, token_ids: Sequence[int]) -> str | None:
    """Why a constrained answer that ended on a stop token does not match its constraint, or None;
    in a worker thread (a replay costs ~20 us a token)."""
    if Constraint.of(params) is None:
        return None
    grammars = state.executor.llm.generator.grammars
    try:
        return await asyncio.to_thread(grammars.verdict, params, list(token_ids))
    except (UnsupportedError, InputError) as exc:  # recompiled after eviction and refused now (too slow)
        return str(exc)
