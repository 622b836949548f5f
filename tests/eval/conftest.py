"""Eval fixtures: tiny random models with a word tokenizer ("w0".."w319"), as HF dir + checkpoint +
onnxruntime engine."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from runner_engines import add_word_tokenizer, build_engine
from word_texts import VOCAB

from converters.convert import convert
from engine_builder.formats.build_config import Limits

TINY_LIMITS = Limits(max_batch=4, max_input_len=8, max_seq_len=96)


@dataclass(frozen=True)
class Tiny:
    hf: Path  # HF model dir (the transformers reference)
    ckpt: Path
    engine: Path


def add_bos_template(hf_dir: Path) -> None:
    """Make the word tokenizer put BOS ("w1") before every text, as Llama's and Gemma's do."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    tok.save(str(hf_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def tiny(tiny_model_dir, tmp_path_factory):
    """tiny(arch, words=VOCAB, bos=False) -> Tiny, built once per distinct arguments. `words` < VOCAB gives
    a tokenizer with another vocabulary over the same model."""
    made: dict[tuple, Tiny] = {}

    def get(arch: str = "llama", words: int = VOCAB, bos: bool = False) -> Tiny:
        key = (arch, words, bos)
        if key not in made:
            root = tmp_path_factory.mktemp(f"eval-{arch}")
            hf = root / "hf"
            shutil.copytree(tiny_model_dir(arch), hf)
            add_word_tokenizer(hf, words)
            if bos:
                add_bos_template(hf)
            convert(hf, root / "ckpt", dtype="float32")
            made[key] = Tiny(hf, root / "ckpt", build_engine(root / "ckpt", root / "engine", TINY_LIMITS))
        return made[key]

    return get

