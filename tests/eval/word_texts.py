"""Texts for the word tokenizer of the tiny eval models (tests/runner_engines.add_word_tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 320  # tests/tiny_models.py COMMON vocab_size


# The special words w0/w1/w2 are matched anywhere in the text, so "w15" would read as "w1" + unknown
# "5": use the ids whose word does not start with them (3..9, 30..99, 300..)
WORDS = np.array([i for i in range(3, VOCAB) if str(i)[0] not in "012"])


def word_ids(count: int, seed: int = 0) -> list[int]:
    """COUNT random ids that the word tokenizer reads back one word per id."""
    return np.random.default_rng(seed).choice(WORDS, count).tolist()


def write_words(path: Path, ids: list[int], jsonl: bool = False) -> Path:
    text = " ".join(f"w{i}" for i in ids)
    path.write_text(json.dumps({"text": text}) + "\n" if jsonl else text)
    return path
