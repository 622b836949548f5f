"""Streaming detokenization: deltas must add up to a full decode and never show half a character."""

from __future__ import annotations

import pytest
from sample_texts import MULTILINGUAL

from engine_builder.runner.detokenizer import IncrementalDetokenizer

TOKENIZERS = ["smollm2_tokenizer", "metaspace_tokenizer", "byte_fallback_tokenizer"]


def _encode(tok, text: str) -> list[int]:
    if hasattr(tok, "backend_tokenizer"):  # HF fast tokenizer: no BOS/template added
        return tok.encode(text, add_special_tokens=False)
    return tok.encode(text, add_special_tokens=False).ids


def _stream(tok, ids, prompt_ids=(), **kw) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, prompt_ids, **kw)
    deltas = [detok.add(i) for i in ids]
    return deltas, detok.flush()


@pytest.mark.parametrize("tok_name", TOKENIZERS)
@pytest.mark.parametrize("lang", sorted(MULTILINGUAL))
def test_deltas_join_to_full_decode_without_replacement_chars(request, tok_name, lang):
    tok = request.getfixturevalue(tok_name)
    ids = _encode(tok, MULTILINGUAL[lang])
    deltas, tail = _stream(tok, ids)
    assert "".join(deltas) == tok.decode(ids)
    assert tail == ""  # valid text leaves nothing held at the end
    assert not [d for d in deltas if "\ufffd" in d]


@pytest.mark.parametrize("tok_name", ["smollm2_tokenizer", "byte_fallback_tokenizer"])
def test_these_texts_do_split_characters_across_tokens(request, tok_name):
    # Precondition that gives the test above its teeth: decoding token by token would
    # print U+FFFD for these tokenizers, and naive per-token decode does not add up.
    tok = request.getfixturevalue(tok_name)
    for lang in ("chinese", "emoji", "hindi"):
        ids = _encode(tok, MULTILINGUAL[lang])
        naive = [tok.decode([i]) for i in ids]
        assert any("\ufffd" in piece for piece in naive), lang


def test_metaspace_naive_per_token_decode_loses_spaces(metaspace_tokenizer):
    ids = _encode(metaspace_tokenizer, MULTILINGUAL["english"])
    naive = "".join(metaspace_tokenizer.decode([i]) for i in ids)
    streamed = "".join(_stream(metaspace_tokenizer, ids)[0])
    assert " " not in naive and streamed == metaspace_tokenizer.decode(ids) and " " in streamed


def test_smollm2_roundtrip_is_exact(smollm2_tokenizer):
    # byte-level BPE is lossless, so here the stream reproduces the original text itself
    text = MULTILINGUAL["mixed"]
    assert "".join(_stream(smollm2_tokenizer, _encode(smollm2_tokenizer, text))[0]) == text


@pytest.mark.parametrize("tok_name", TOKENIZERS)
def test_first_generated_token_keeps_its_leading_space_after_a_prompt(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    prompt = _encode(tok, "The quick brown")
    full = _encode(tok, "The quick brown fox jumps")
    assert full[:len(prompt)] == prompt
    deltas, tail = _stream(tok, full[len(prompt):], prompt_ids=prompt)
    assert "".join(deltas) + tail == " fox jumps"
    assert deltas[0].startswith(" ")


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_skipped_or_kept(smollm2_tokenizer, skip):
    tok = smollm2_tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    ids = _encode(tok, "Hello 世界") + [im_end] + _encode(tok, " Grüße 👍🏽")
    deltas, tail = _stream(tok, ids, skip_special_tokens=skip)
    text = "".join(deltas) + tail
    assert text == tok.decode(ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in text) is (not skip)


def test_special_token_inside_metaspace_text(metaspace_tokenizer):
    tok = metaspace_tokenizer
    eos = tok.token_to_id("</s>")
    ids = _encode(tok, "Größere Straßen") + [eos] + _encode(tok, "über die Brücke")
    for skip in (True, False):
        deltas, tail = _stream(tok, ids, skip_special_tokens=skip)
        assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=skip)


def test_unfinished_character_is_held_then_flushed(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = _encode(tok, "ok 🚀")
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[-1].endswith("\ufffd")  # the rocket's last byte token alone is not text
    deltas, tail = _stream(tok, ids[:-1])  # stream ends mid-character
    assert "".join(deltas) == "ok"  # " " + half a rocket is held, not shown as " \ufffd"
    assert "".join(deltas) + tail == tok.decode(ids[:-1])  # flush emits the U+FFFD decode gives
    assert tail.endswith("\ufffd")
