"""The eval text (shipped, .txt, .jsonl), its windows, and the running sums checked against torch's own losses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from word_texts import word_ids, write_words

from engine_builder.eval.scores import ScoreSums
from engine_builder.eval.text import load_text, special_prefix, token_windows
from engine_builder.util.errors import InputError


def test_shipped_text_is_julius_caesar():
    text = load_text(None)
    assert text.source == "builtin:eval.txt" and text.text.startswith("JULIUS CAESAR") and len(text.text) > 100_000


def test_jsonl_documents_join_like_paragraphs(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "first"}) + "\n\n" + json.dumps({"text": "second", "id": 2}) + "\n")
    assert load_text(path).text == "first\n\nsecond"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    with pytest.raises(InputError, match=r"line 2 has no string \"text\" field"):
        load_text(path)
    path.write_text("{not json\n")
    with pytest.raises(InputError, match="line 1 is not JSON"):
        load_text(path)


def test_windows_cover_the_text_in_order(tiny, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny("llama").hf)
    ids = word_ids(193)
    text = load_text(write_words(tmp_path / "w.txt", ids))
    assert special_prefix(tokenizer) == []
    windows = token_windows(tokenizer, text, max_tokens=193, context=96)
    # 96 + 96 + 1: a 1-token window predicts nothing and is dropped
    assert [w.tolist() for w in windows] == [ids[:96], ids[96:192]]
    assert [w.tolist() for w in token_windows(tokenizer, text, max_tokens=50, context=30)] == [ids[:30], ids[30:50]]
    with pytest.raises(InputError, match="--max-tokens must be at least 2"):
        token_windows(tokenizer, text, max_tokens=1, context=30)
    with pytest.raises(InputError, match="has 1 token"):
        token_windows(tokenizer, load_text(write_words(tmp_path / "one.txt", ids[:1])), max_tokens=10, context=30)


def test_bos_prefix_goes_before_every_window(tiny, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny("llama", bos=True).hf)
    ids = word_ids(20)
    assert special_prefix(tokenizer) == [1]
    windows = token_windows(tokenizer, load_text(write_words(tmp_path / "w.txt", ids)), max_tokens=20, context=11)
    assert [w.tolist() for w in windows] == [[1, *ids[:10]], [1, *ids[10:]]]


def test_sums_match_torch_cross_entropy_and_kl_div():
    rng = np.random.default_rng(0)
    sums = ScoreSums()
    steps = [(rng.normal(size=(rows, 50)).astype(np.float32) * 3, rng.integers(0, 50, rows),
              rng.normal(size=(rows, 50)).astype(np.float32) * 3) for rows in (4, 4, 2)]
    for logits, targets, reference in steps:
        sums.add(logits, targets, reference)
    logits, targets, reference = (torch.from_numpy(np.concatenate(x)) for x in zip(*steps))
    logits, reference = logits.double(), reference.double()
    nll = torch.nn.functional.cross_entropy(logits, targets, reduction="mean").item()
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), reference.log_softmax(-1), log_target=True,
                                    reduction="batchmean").item()  # KL(reference || model) per position
    assert sums.positions == 10
    assert sums.ppl == pytest.approx(np.exp(nll), rel=1e-12)
    assert sums.mean_kl == pytest.approx(kl, rel=1e-12)
    assert sums.top1_agreement == (logits.argmax(-1) == reference.argmax(-1)).double().mean().item()
    assert sums.reference_ppl == pytest.approx(
        np.exp(torch.nn.functional.cross_entropy(reference, targets).item()), rel=1e-12)
