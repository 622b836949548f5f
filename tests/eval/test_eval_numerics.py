"""eval's figures against Hugging Face transformers' own loss, on tiny random models with a word tokenizer.

Perplexity must equal exp of the token-weighted mean of `model(ids, labels=ids).loss` over exactly
the windows eval scored; KL of an engine against itself is exactly 0; a checkpoint reference (built
on the fly) gives the figures of the same reference built as an engine dir.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from runner_engines import build_engine
from word_texts import word_ids, write_words

from engine_builder.eval import evaluate

TOKENS = 500  # 6 windows of <= 96 (the tiny engines' max_seq_len) in 4 KV slots: two rounds, the last window short


def hf_ppl(hf_dir: Path, windows: list[list[int]]) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    total = count = 0
    with torch.no_grad():
        for w in windows:
            ids = torch.tensor([w])
            loss = model(input_ids=ids, labels=ids).loss  # mean over the len(w) - 1 predicted positions
            total += loss.item() * (len(w) - 1)
            count += len(w) - 1
    return math.exp(total / count)


def cut(ids: list[int], size: int, prefix: tuple[int, ...] = ()) -> list[list[int]]:
    return [[*prefix, *ids[i:i + size]] for i in range(0, len(ids), size)]


@pytest.mark.parametrize("arch,context", [
    ("llama", 96),  # the engine's max_seq_len caps the default context (256)
    ("gemma2", 96),  # sliding window 8, attention and final logit soft-capping
    ("phi3", 64),  # longrope: windows stay within the short-factor range (original_max_position_embeddings)
])
def test_ppl_equals_transformers_loss(tiny, tmp_path, arch, context):
    t = tiny(arch)
    ids = word_ids(TOKENS)
    result = evaluate(t.engine, text=write_words(tmp_path / "words.txt", ids), max_tokens=TOKENS)
    windows = cut(ids, context)
    assert (result.context, result.windows, result.tokens) == (context, len(windows), TOKENS - len(windows))
    assert (result.kl, result.top1_agreement, result.reference_path) == (None, None, None)
    assert result.ppl == pytest.approx(hf_ppl(t.hf, windows), rel=1e-4)


def test_bos_starts_every_window_and_every_text_token_is_scored(tiny, tmp_path):
    t = tiny("llama", bos=True)
    ids = word_ids(TOKENS, seed=1)
    result = evaluate(t.engine, text=write_words(tmp_path / "words.txt", ids), max_tokens=TOKENS, context=50)
    windows = cut(ids, 49, prefix=(1,))  # "w1" is the BOS the tokenizer adds
    assert (result.context, result.windows, result.tokens) == (50, len(windows), TOKENS)
    assert result.ppl == pytest.approx(hf_ppl(t.hf, windows), rel=1e-4)


def test_engine_against_itself_has_zero_kl(tiny, tmp_path):
    t = tiny("llama")
    text = write_words(tmp_path / "words.txt", word_ids(TOKENS))
    result = evaluate(t.engine, reference=t.engine, text=text, max_tokens=TOKENS)
    assert result.kl == 0.0 and result.top1_agreement == 1.0
    assert result.reference_ppl == result.ppl and result.reference_path == str(t.engine)


def test_checkpoint_reference_equals_engine_reference(tiny, tmp_path):
    t = tiny("llama")
    fp16 = build_engine(t.ckpt, tmp_path / "fp16", dtype="float16")  # something measurably off the reference
    text = write_words(tmp_path / "words.txt", word_ids(TOKENS))
    before = set(Path(tempfile.gettempdir()).glob("trtbuild-eval-reference-*"))
    from_ckpt = evaluate(fp16, reference=t.ckpt, text=text, max_tokens=TOKENS, context=96)
    assert set(Path(tempfile.gettempdir()).glob("trtbuild-eval-reference-*")) == before  # the temp build is gone
    from_engine = evaluate(fp16, reference=t.engine, text=text, max_tokens=TOKENS, context=96)
    # a random model's logits are nearly flat: fp16 moves them only a little
    assert from_ckpt.kl > 0 and from_ckpt.ppl != from_ckpt.reference_ppl
    assert from_ckpt.kl == pytest.approx(from_engine.kl, rel=1e-6)
    assert from_ckpt.top1_agreement == from_engine.top1_agreement
    assert from_ckpt.reference_ppl == pytest.approx(from_engine.reference_ppl, rel=1e-7)
    assert from_ckpt.ppl == from_engine.ppl
