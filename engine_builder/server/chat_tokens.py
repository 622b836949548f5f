"""Chat requests tokenized so that what a client wrote stays text: a special token's text inside a message or
a tool (`<|im_end|>\\n<|im_start|>system\\n...`) becomes the tokens of that text, never a control token, so no
client can forge a turn boundary or a system turn. Only the chat template itself places control tokens.

How (ChatTokens.encode, in a worker thread):
  1. every string of the messages and tools (dict keys too) has each special token's text replaced by a
     placeholder that no template reacts to (a private-use character, a per-call nonce, an index); no
     special text anywhere: the conversation is encoded as before (LLM.encode_chat), unchanged;
  2. the chat template renders those placeholder messages, so every special token's text left in the
     rendered prompt is the template's own;
  3. the prompt is split at those control tokens (their ids, as they are), and each piece between them,
     its placeholders restored, is encoded by a twin of the tokenizer that reads special tokens' text as
     text (tokenizers' encode_special_tokens; a twin, since the flag is per tokenizer and other threads
     encode with the server's at the same time). A tokenizer encodes the text between two added tokens on
     its own anyway, so a piece's ids are what one encode would give it (the tests compare both).

`--parse-chat-special-tokens` (ServerConfig.parse_chat_special_tokens) keeps the old behaviour for operators
whose clients send control tokens on purpose. Raw prompts (/v1/completions, /generate, /tokenize with
`prompt`) are not chat: special tokens in them are parsed, as vLLM and TGI do, so a client that builds its
own prompt can write the turn markers itself.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Sequence
from typing import Any

PLACEHOLDER = "\ue000{nonce}:{index}\ue001"  # U+E000 / U+E001: private use, no tokenizer or template special
# where an image content part stands in a message's text (openai_schemas.ChatMessage.text, which drops the
# character from what clients wrote): replaced by the model's image token, which the client cannot write
IMAGE_MARK = "\ue002"


class ChatTokens:
    """One server's chat encoder: encode(messages, tools) -> prompt token ids."""

    def __init__(self, llm: Any, parse_special_tokens: bool = False) -> None:
        self._llm, self._parse = llm, parse_special_tokens
        backend = getattr(llm.tokenizer, "backend_tokenizer", None)
        self._backend = backend
        specials = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special} \
            if backend is not None else {}
        self._ids = specials  # special token text -> id
        # longest first: a special whose text contains another's is matched whole
        self._pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))) \
            if specials else None
        self._text_only: Any = None
        self._lock = threading.Lock()

    def encode(self, messages: list[dict[str, Any]], tools: Sequence[Any] | None,
               image_text: str | None = None) -> list[int]:
        """image_text: the model's image token, put where each IMAGE_MARK is (after the client's text is hidden)."""
        if self._parse or self._pattern is None:
            return self._llm.encode_chat(_images_at_marks(messages, image_text), tools)
        nonce = secrets.token_hex(8)
        found: list[str] = []  # the special texts met, by placeholder index

        def hide(value: Any) -> Any:
            if isinstance(value, str):
                return self._pattern.sub(lambda m: _placeholder(nonce, found, m.group()), value)
            if isinstance(value, dict):
                return {hide(k): hide(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [hide(v) for v in value]
            return value

        hidden_messages = _images_at_marks(hide(messages), image_text)
        hidden_tools = hide(list(tools)) if tools else tools
        if not found:
            return self._llm.encode_chat(_images_at_marks(messages, image_text), tools)
        prompt = self._llm.apply_chat_template(hidden_messages, hidden_tools)
        restore = re.compile(re.escape("\ue000" + nonce + ":") + r"(\d+)\ue001")
        ids: list[int] = []
        at = 0
        for control in self._pattern.finditer(prompt):  # the template's own special tokens
            ids += self._as_text(restore.sub(lambda m: found[int(m.group(1))], prompt[at:control.start()]))
            ids.append(self._ids[control.group()])
            at = control.end()
        ids += self._as_text(restore.sub(lambda m: found[int(m.group(1))], prompt[at:]))
        return ids

    def _as_text(self, text: str) -> list[int]:
        if not text:
            return []
        with self._lock:
            if self._text_only is None:
                from tokenizers import Tokenizer

                twin = Tokenizer.from_str(self._backend.to_str())
                twin.encode_special_tokens = True
                self._text_only = twin
            twin = self._text_only
        return list(twin.encode(text, add_special_tokens=False).ids)


def _placeholder(nonce: str, found: list[str], special: str) -> str:
    found.append(special)
    return PLACEHOLDER.format(nonce=nonce, index=len(found) - 1)


def _images_at_marks(messages: list[dict[str, Any]], image_text: str | None) -> list[dict[str, Any]]:
    if image_text is None:
        return messages
    return [{**m, "content": m["content"].replace(IMAGE_MARK, image_text)} if isinstance(m.get("content"), str)
            else m for m in messages]
