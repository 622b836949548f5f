"""Tokenizers for runner tests, all made offline: the real SmolLM2 one and two trained here."""

from __future__ import annotations

import json

import pytest
from sample_texts import ENGLISH_CORPUS, MULTILINGUAL
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.implementations import SentencePieceBPETokenizer
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

SPECIAL = ["<unk>", "<s>", "</s>"]


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """Byte-level BPE (GPT-2 style), as an HF fast tokenizer: the real thing."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def metaspace_tokenizer() -> Tokenizer:
    """SentencePiece-style BPE: Metaspace pre-tokenizer and decoder ("▁" marks a space),
    trained on the test texts so every character is in its vocabulary; the small vocab
    leaves words in several pieces and many lone "▁" tokens."""
    tok = SentencePieceBPETokenizer()
    corpus = list(MULTILINGUAL.values()) * 3
    tok.train_from_iterator(corpus, vocab_size=350, min_frequency=1, special_tokens=SPECIAL, show_progress=False)
    return tok._tokenizer


@pytest.fixture(scope="session")
def byte_fallback_tokenizer() -> Tokenizer:
    """Llama/Mistral-style: "▁" for spaces, and characters outside the (English-only)
    vocabulary encoded as <0xNN> byte tokens, decoded by ByteFallback + Fuse + Strip."""
    tok = Tokenizer(BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    trainer = BpeTrainer(vocab_size=400, special_tokens=SPECIAL, show_progress=False)
    tok.train_from_iterator(ENGLISH_CORPUS, trainer)
    # Add the 256 byte tokens as ordinary vocabulary (as Llama's tokenizer.model has them)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok
