"""Runner test fixtures, all made offline: tokenizers (the real SmolLM2 one and two trained here),
engine dirs built from SmolLM2 and tiny random models, and the HF reference model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from runner_engines import add_word_tokenizer, build_engine
from sample_texts import ENGLISH_CORPUS, MULTILINGUAL
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.implementations import SentencePieceBPETokenizer
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

from converters.convert import convert
from engine_builder.formats.build_config import Limits

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


# --- engine dirs for the generation tests (built once per session) ---------------------------


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir, tmp_path_factory):
    """tiny_engine(arch, limits=..., ort_passes=None, dtype="float32") -> (engine dir, HF dir with a
    word tokenizer), built once per distinct arguments."""
    made: dict[tuple, tuple[Path, Path]] = {}

    def get(arch: str = "llama", limits: Limits = Limits(max_batch=4, max_input_len=32, max_seq_len=96),
            ort_passes: tuple[str, ...] | None = None, dtype: str = "float32") -> tuple[Path, Path]:
        key = (arch, limits, ort_passes, dtype)
        if key not in made:
            root = tmp_path_factory.mktemp(f"tiny-{arch}")
            hf = root / "hf"
            shutil.copytree(tiny_model_dir(arch), hf)
            add_word_tokenizer(hf, 320)
            convert(hf, root / "ckpt", dtype="float32")
            made[key] = build_engine(root / "ckpt", root / "engine", limits, dtype, ort_passes), hf
        return made[key]

    return get
