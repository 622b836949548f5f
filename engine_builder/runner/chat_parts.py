"""Chat messages as typed content parts, for the templates that iterate them.

Multimodal chat templates (SmolVLM's and Idefics3's, llava-hf's) loop over each message's content as a list of
parts ({"type": "text", "text": ...}, {"type": "image"}) and write the image token themselves; given a string,
jinja iterates its characters and the turn comes out empty. Templates that take both check `is string` first
(Gemma 3's, Qwen2-VL's) and keep their string path. The runtime holds a turn as text with the image token where each
image goes (image_prompts.with_image_tokens), so for a parts template each string becomes parts: the text between
image tokens, and an image part for each token together with the newline after it, which these templates write
themselves ("<image>" then the text, as transformers' processors lay out [image, text])."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_TYPED = re.compile(r"""\[\s*['"]type['"]\s*\]|\.type\b|selectattr\(\s*['"]type['"]""")


def takes_parts(template: str) -> bool:
    """Does this chat template read typed content parts only (no `is string` path for plain text)?"""
    return bool(_TYPED.search(template)) and "is string" not in template


def as_parts(messages: Sequence[Mapping[str, Any]], image_token: str | None) -> list[dict[str, Any]]:
    """The messages with each string content as parts: text, and {"type": "image"} where image_token stood."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            pieces = re.split(f"{re.escape(image_token)}\n?", content) if image_token else [content]
            parts: list[dict[str, Any]] = []
            for i, text in enumerate(pieces):
                if i:
                    parts.append({"type": "image"})
                if text:
                    parts.append({"type": "text", "text": text})
            m = {**m, "content": parts}
        out.append(dict(m))
    return out
