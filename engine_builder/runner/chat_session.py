"""A multi-turn conversation over one LLM whose KV cache carries the history from turn to turn.

Each turn's prompt is the chat template over every message so far, so it starts with the previous
turn's prompt and answer. After a turn the slot's KV (prompt and answer) goes into a prefix cache
(runner/kv/prefix_cache.py) in small blocks, and the next turn copies it back instead of computing it:
only the new user message, the template's markers around it and a partial block are prefilled.
Re-tokenizing the answer's text usually gives back the generated ids; where it does not, reuse
stops at the first differing block and the rest is prefilled, which costs time, never correctness.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine_builder.runner.llm import LLM
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.tunables import CHAT_BLOCK_TOKENS, CHAT_CACHE_BYTES
from engine_builder.runner.vision.image_prompts import placeholder_text, with_image_tokens
from engine_builder.util.errors import InputError


@dataclass(frozen=True)
class TurnStats:
    prompt_tokens: int  # the whole conversation as this turn's prompt
    reused_tokens: int  # copied from the cache
    new_tokens: int  # generated
    prefill_ms: float
    decode_seconds: float

    @property
    def prefilled_tokens(self) -> int:
        return self.prompt_tokens - self.reused_tokens


class ChatSession:
    """`for delta in session.send("Hi"): ...`, then `session.last` (TurnStats); `reset()` forgets the history."""

    def __init__(self, llm: LLM, system: str | None = None, params: SamplingParams | None = None) -> None:
        self.llm, self.system = llm, system
        self.params = params
        kv = llm.generator.backend.kv
        # a host-memory cache only (onnxruntime); a graph that recomputes long sequences (longrope) cannot reuse;
        # an LLM opened with prefix_cache=False (`trtbuild chat --no-prefix-cache`) prefills every turn whole
        self.reuses = (bool(kv.keys) and llm.generator.backend.reprefill_after is None
                       and llm.generator.prefix_cache is not None)
        if self.reuses:
            llm.generator.prefix_cache = _chat_cache(kv)
            llm.generator.cache_outputs = True
        self.messages: list[dict[str, Any]] = []
        self.images: list[Any] = []  # every image of the conversation so far, in order (vision-language engines)
        self.last: TurnStats | None = None
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.images = []
        if self.reuses:  # the old conversation's blocks would only take memory
            gen = self.llm.generator
            gen.prefix_cache = _chat_cache(gen.backend.kv)

    def send(self, text: str, images: Sequence[Any] = ()) -> Iterator[str]:
        """Stream the assistant's answer to TEXT (with IMAGES before it, a vision-language engine's); the turn joins
        the history once the answer is complete. Earlier turns' images stay in the prompt (their features and KV
        blocks are reused by their content)."""
        message = {"role": "user", "content": text}
        if images:
            token = placeholder_text(self.llm.engine, self.llm.tokenizer)
            if token is None:
                raise InputError(f"{self.llm.engine.path} is a text-only engine; it takes no images")
            message = with_image_tokens([message], len(images), token)[0]
        messages, pictures = [*self.messages, message], [*self.images, *images]
        params = self._fitted(messages, len(pictures))
        cache = self.llm.generator.prefix_cache if self.reuses else None
        hits = cache.stats().hit_tokens if cache is not None else 0
        with self.llm.stream_chat(messages, params, images=pictures or None) as stream:
            yield from stream
        out, timings = stream.output, stream.timings
        reused = (cache.stats().hit_tokens - hits) if cache is not None else 0
        self.last = TurnStats(len(out.prompt_token_ids), reused, len(out.token_ids),
                              timings.prefill_ms if timings else 0.0, timings.decode_seconds if timings else 0.0)
        self.messages, self.images = [*messages, {"role": "assistant", "content": out.text}], pictures


    def _fitted(self, messages: list[dict[str, Any]], images: int = 0) -> SamplingParams:
        """This turn's parameters with the answer capped at the positions the conversation leaves (llama.cpp's chat
        does the same with its context): a long conversation gets shorter answers, not an error each turn."""
        params = self.params or self.llm.default_params()
        max_seq = self.llm.generator.backend.kv.max_seq
        vision = self.llm.engine.model.vision
        # an image's layout beyond its one placeholder token (its tokens and, at most, what the processor puts around)
        extra = images * vision.max_image_tokens() if images and vision is not None else 0
        room = max_seq - len(self.llm.encode_chat(messages)) - extra
        if room < 1:
            raise InputError(f"the conversation fills all {max_seq} positions of the engine (its max_seq_len); start "
                             "a new one, or rebuild the engine with a larger --max-seq-len")
        return replace(params, max_new_tokens=room) if params.max_new_tokens > room else params


def _chat_cache(kv):
    """A paged engine's blocks are shared by reference (its pool evicts old turns when short); a slot
    engine's are copied into a cache of their own, in small blocks (at most 3 tokens of history prefilled again)."""
    return kv.prefix_cache(budget_bytes=CHAT_CACHE_BYTES, block_size=CHAT_BLOCK_TOKENS)
