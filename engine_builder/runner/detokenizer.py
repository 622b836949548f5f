"""Streaming detokenization: text deltas as tokens arrive, equal in sum to a full decode.

Decoding one token at a time is wrong for two reasons: a byte-level token may hold part of a
UTF-8 character (decoding it alone gives U+FFFD), and SentencePiece/Metaspace decoders drop
the leading space of the first token they see (so "▁world" alone decodes to "world").
The prefix-offset/read-offset algorithm of TGI and vLLM fixes both by always decoding a short
window that starts at an earlier token:

    prefix_offset            read_offset              len(ids)
         |--- already emitted ---|--- not yet emitted ---|
    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])

If new_text is longer than prefix_text and does not end in U+FFFD (an unfinished character),
the delta is new_text[len(prefix_text):] and both offsets move forward (prefix_offset to the
old read_offset, so the next window keeps one emitted chunk of left context). Otherwise the
token is held until later tokens complete it. Both decodes start at the same token, so
whatever the decoder does to the first token of a call happens to both and cancels out.

Decoding goes through the `tokenizers.Tokenizer` (an HF fast tokenizer's backend_tokenizer),
so HF's `clean_up_tokenization_spaces` post-processing is not applied to streamed text; vLLM
streams the same way. The SmolLM2 and Llama-family tokenizers have it off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Tokens of prompt kept as left context for the first generated token (vLLM uses 5): enough
# to cover a character split over up to 4 byte tokens plus one token of word context.
PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """One request's text stream. `add(token_id)` returns the new text (possibly "");
    `flush()` returns what is still held at the end (an unfinished character as U+FFFD),
    after which the concatenated deltas equal `decode(generated_ids)` (no prompt), or the
    part of `decode(prompt_ids + generated_ids)` after the prompt's text (tested for
    byte-level, Metaspace and ByteFallback decoders).
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), *, skip_special_tokens: bool = True) -> None:
        # HF fast tokenizers wrap a tokenizers.Tokenizer; decode through it directly
        self._tokenizer = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = [int(t) for t in prompt_ids]  # prompt + generated
        self.prompt_len = len(self.token_ids)
        self.text = ""  # everything emitted so far (generated text only)
        self._read_offset = self.prompt_len
        self._prefix_offset = max(0, self.prompt_len - PROMPT_CONTEXT_TOKENS)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)

    @property
    def generated_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    def add(self, token_id: int) -> str:
        self.token_ids.append(int(token_id))
        new_text = self._decode(self._prefix_offset, len(self.token_ids))
        # Shorter or equal: a skipped special token (or a decoder that merges); ends in U+FFFD:
        # an unfinished multi-byte character. Either way wait for more tokens.
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        return self._emit(new_text)

    def flush(self) -> str:
        """Emit whatever is held; call once when the sequence ends."""
        new_text = self._decode(self._prefix_offset, len(self.token_ids))
        if len(new_text) <= len(self._prefix_text):
            return ""
        return self._emit(new_text)

    def _emit(self, new_text: str) -> str:
        delta = new_text[len(self._prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        self.text += delta
        return delta

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tokenizer.decode(self.token_ids[start:end], skip_special_tokens=self.skip_special_tokens)
