"""Embedding routes: POST /v1/embeddings (OpenAI) and POST /embed (TEI), over an EmbeddingBatcher.

Registered on every app (asgi_app.py): a server over a text-generation engine answers them with a
400 that says so; a server over an encoder engine (embedding_app.py) has an EmbeddingService on
app.state.embeddings and answers them.

OpenAI /v1/embeddings
  input             a string, a list of strings, token ids, or a list of token-id lists (as OpenAI takes)
  encoding_format   "float" (default) or "base64": the little-endian float32 bytes, base64 encoded (what
                    the openai client asks for by default and decodes)
  dimensions        refused with a 400 unless it equals the model's own size: these models have no
                    shortened (Matryoshka) vectors
  usage             prompt_tokens = total_tokens = the tokens of every input (special tokens included)
  An input longer than the engine takes is a 422 (OpenAI refuses too; nothing is cut silently).
TEI /embed
  {"inputs": str | [str], "normalize": true, "truncate": false} -> [[float, ...], ...]
  truncate: cut long inputs to the engine's length instead of refusing them. normalize: L2-normalize
  (a model whose sentence-transformers modules normalize is always unit-length).
Requests are tokenized off the event loop, then queued to the batcher, which batches concurrent ones.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from engine_builder.executor.embedding_batcher import EmbeddingBatcher
from engine_builder.server.config import ServerConfig
from engine_builder.server.generation import off_loop
from engine_builder.server.http_errors import MODEL_NOT_FOUND, OVERLOADED, VALIDATION, ApiError, ErrorKind
from engine_builder.server.schema_types import Text
from engine_builder.util.errors import CapacityError

MAX_INPUTS = 2048  # OpenAI's own limit of inputs per request
# the request asks for something this model cannot do (vLLM answers these with 400 too)
UNSUPPORTED = ErrorKind(400, "validation", "invalid_request_error", "unsupported")

router = APIRouter(tags=["embeddings"])


@dataclass
class EmbeddingService:
    """What the embedding routes share (app.state.embeddings); also app.state.server for serve's shutdown."""

    batcher: EmbeddingBatcher
    config: ServerConfig
    active: int = 0  # admitted requests not yet answered

    def cancel_all(self) -> None:
        """serve()'s shutdown hook: queued work is short, so it is left to finish."""

    def admit(self) -> None:
        if self.active >= self.config.max_concurrent_requests:
            raise ApiError(OVERLOADED, f"the server is busy: {self.active} requests are active "
                                       f"(max_concurrent_requests {self.config.max_concurrent_requests}); retry later")
        self.active += 1

    async def embed(self, token_ids: list[list[int]]) -> np.ndarray:
        self.admit()
        try:
            try:
                future = self.batcher.submit(token_ids)
            except CapacityError as exc:
                raise ApiError(OVERLOADED, str(exc)) from None
            return await asyncio.wrap_future(future)
        finally:
            self.active -= 1


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Text | list[Text] | list[int] | list[list[int]]
    model: Text | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: Text | None = None  # an end-user id for abuse tracking upstream: accepted, unused


class TeiEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Text | list[Text]
    normalize: bool = True
    truncate: bool = False
    truncation_direction: Literal["right", "Right"] = "right"


def _service(request: Request) -> EmbeddingService:
    service = getattr(request.app.state, "embeddings", None)
    if service is None:
        raise ApiError(UNSUPPORTED, "this server serves a text-generation model, which computes no embeddings; "
                                    "serve an encoder engine (a BERT / sentence-transformers model) for "
                                    "/v1/embeddings and /embed")
    return service


def _tokenize(service: EmbeddingService, texts: Sequence[str], truncate: bool) -> list[list[int]]:
    embedder = service.batcher.embedder
    if not truncate:
        return embedder.tokenizer(list(texts), add_special_tokens=True).input_ids
    return embedder.tokenize(texts, _longest(service))


def _longest(service: EmbeddingService) -> int:
    """The engine's input length, or --max-input-tokens when lower."""
    return min(service.batcher.embedder.max_tokens, service.config.max_input_tokens)


def _check(service: EmbeddingService, inputs: list[Any], token_ids: list[list[int]], fix: str) -> None:
    longest = _longest(service)
    for i, ids in enumerate(token_ids):
        if len(ids) > longest:
            raise ApiError(VALIDATION, f"input {i} has {len(ids)} tokens but this model takes at most {longest}; "
                                       f"{fix}")


@router.post("/v1/embeddings", summary="Embeddings of one or more inputs (OpenAI)")
async def embeddings(request: Request, body: EmbeddingRequest) -> dict[str, Any]:
    service = _service(request)
    name, size = service.config.model_name, service.batcher.embedder.dimensions
    if body.model is not None and body.model != name:
        raise ApiError(MODEL_NOT_FOUND, f"model {body.model!r} does not exist on this server; it serves {name!r} "
                                        "(see GET /v1/models)")
    if body.dimensions is not None and body.dimensions != size:
        raise ApiError(UNSUPPORTED, f"dimensions {body.dimensions} is not supported: {name} gives {size}-dimensional "
                                    "embeddings only; leave dimensions out")
    raw = body.input
    if isinstance(raw, str) or (raw and isinstance(raw[0], int)):
        raw = [raw]  # one text, or one list of token ids
    if not raw:
        raise ApiError(VALIDATION, "input is empty; send a string or a list of strings")
    if len(raw) > MAX_INPUTS:
        raise ApiError(VALIDATION, f"input has {len(raw)} items; send at most {MAX_INPUTS} per request")
    if any(len(item) == 0 for item in raw):
        raise ApiError(VALIDATION, "input holds an empty string or token list; every input must be non-empty")
    if isinstance(raw[0], str):
        token_ids = await off_loop(_tokenize, service, raw, False)
    else:
        vocab = service.batcher.embedder.engine.model.vocab_size
        if any(not 0 <= t < vocab for ids in raw for t in ids):
            raise ApiError(VALIDATION, f"token ids must be in [0, {vocab}) for this model")
        token_ids = [list(ids) for ids in raw]
    _check(service, raw, token_ids, "shorten it or split it into several inputs")
    vectors = await service.embed(token_ids)
    tokens = sum(len(ids) for ids in token_ids)
    data = [{"object": "embedding", "index": i,
             "embedding": _encode(vector, body.encoding_format)} for i, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@router.post("/embed", summary="Embeddings of one or more texts (Text Embeddings Inference)")
async def tei_embed(request: Request, body: TeiEmbedRequest) -> list[list[float]]:
    service = _service(request)
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
    if not texts or any(not t for t in texts):
        raise ApiError(VALIDATION, "inputs must be a non-empty string or a list of non-empty strings")
    if len(texts) > MAX_INPUTS:
        raise ApiError(VALIDATION, f"inputs has {len(texts)} texts; send at most {MAX_INPUTS} per request")
    token_ids = await off_loop(_tokenize, service, texts, body.truncate)
    _check(service, texts, token_ids, "shorten it, or send \"truncate\": true")
    vectors = await service.embed(token_ids)
    if body.normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors.tolist()


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # what OpenAI sends: the float32 bytes, little-endian
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.tolist()
