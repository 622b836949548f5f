"""vLLM's POST /tokenize and /detokenize: the server's own tokenizer, so a client can count tokens and
see exactly what a chat template renders (tools included) before it sends a request.

    /tokenize    {"prompt": "...", "add_special_tokens": true} or {"messages": [...], "tools": [...]}
                 -> {"count", "max_model_len", "tokens": [...]}
    /detokenize  {"tokens": [...]} -> {"prompt": "..."}

messages are tokenized as the chat route tokenizes them (special tokens' text in them stays text, unless
--parse-chat-special-tokens); a prompt is raw text whose special tokens are parsed, as /v1/completions does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict

from engine_builder.server import tool_calls
from engine_builder.server.generation import ServerState, off_loop, server_state
from engine_builder.server.http_errors import VALIDATION, ApiError
from engine_builder.server.openai_schemas import ChatMessage
from engine_builder.server.schema_types import Text

router = APIRouter(tags=["Tokenizer"])


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    prompt: Text | None = None
    add_special_tokens: bool = True
    messages: list[ChatMessage] | None = None
    tools: list[tool_calls.Tool] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Text | None = None
    tokens: list[int]


@router.post("/tokenize", summary="Token ids of a prompt or a chat (vLLM)")
async def tokenize(body: TokenizeRequest, state: ServerState = Depends(server_state)) -> dict[str, Any]:
    llm = state.executor.llm
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(VALIDATION, "give prompt (text) or messages (a chat), not both or neither")
    if body.prompt is not None:
        def encode() -> list[int]:
            return list(llm.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids)

        ids = await off_loop(encode)
    else:
        tool_plan = tool_calls.plan(body.tools, None)
        messages, tools = tool_calls.render(body.messages, tool_plan, tool_calls.template_knows_tools(llm.tokenizer))
        ids = await off_loop(state.chat_tokens.encode, messages, tools)
    return {"count": len(ids), "max_model_len": state.config.max_total_tokens, "tokens": list(ids)}


@router.post("/detokenize", summary="Text of token ids (vLLM)")
async def detokenize(body: DetokenizeRequest, state: ServerState = Depends(server_state)) -> dict[str, Any]:
    vocab = state.executor.llm.backend.vocab_size
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise ApiError(VALIDATION, f"tokens must be ids in [0, {vocab}), got {bad}")
    return {"prompt": await off_loop(state.executor.llm.tokenizer.decode, body.tokens)}
