"""The prompt of a request body, as text, for the prefix-aware policy: TGI `inputs`, OpenAI completions'
`prompt`, chat `messages` (role and text of each, in order: requests sharing a system prompt share a
prefix). Anything else, or a body that is not JSON, gives "": the backend answers it (422), not us."""

from __future__ import annotations

import json
from typing import Any


def prompt_text(path: str, body: bytes) -> str:
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(data, dict):
        return ""
    if path.endswith("/chat/completions"):
        return _messages_text(data.get("messages"))
    if path.endswith("/completions"):
        return _text(data.get("prompt"))
    return _text(data.get("inputs"))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:  # a batch of prompts (the first leads), or token ids
        first = value[0]
        if isinstance(first, str):
            return first
        if isinstance(first, int):
            return " ".join(str(v) for v in value)
        if isinstance(first, list):
            return " ".join(str(v) for v in first)
    return ""


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):  # content parts: their text, in order
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                              and isinstance(p.get("text"), str))
        parts.append(f"{m.get('role')}\n{content if isinstance(content, str) else ''}\n")
    return "".join(parts)
