"""The text `trtbuild eval` scores, and how it is cut into windows of token ids.

    text = load_text(None)                                   # the shipped engine_builder/data/eval.txt
    text = load_text(Path("mine.jsonl"))                     # one {"text": ...} object per line
    windows = token_windows(tokenizer, text, max_tokens=1024, context=256)

Each window is scored the way Hugging Face's causal-LM loss scores `model(ids, labels=ids)`:
position t predicts token t+1, so a window of n tokens yields n-1 predictions and its first
token is context only. Windows do not overlap, so every text token is predicted at most once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_builder.util.errors import InputError
from engine_builder.util.text_files import TextFile, builtin_text, read_text_file

if TYPE_CHECKING:  # numpy loads with the scorer, not when the CLI starts
    import numpy as np

BUILTIN = "eval.txt"
DEFAULT_MAX_TOKENS = 1024
# 256 positions: 4 windows of the default 1024 tokens, which run side by side in the KV slots of
# any engine with max_batch >= 4, so one engine call scores 4 positions (CPU decode steps cost
# far less than 4x at batch 4). Longer windows lower the perplexity but not the comparison.
DEFAULT_CONTEXT = 256


EvalText = TextFile  # .text, .source (the path given, or "builtin:eval.txt"), .sha256


def load_text(path: Path | None) -> EvalText:
    """The text of PATH (.txt raw, .jsonl a "text" field per line); None = the shipped text."""
    return builtin_text(BUILTIN) if path is None else read_text_file(path, "eval text", "--text")


def special_prefix(tokenizer: Any) -> list[int]:
    """The ids the tokenizer puts before any text by default (e.g. Llama's or Gemma's BOS), else [].

    Each window starts with them, as it would when the model sees a document, so the first text
    token of every window is predicted from BOS rather than left unscored.
    """
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return list(full[:start])
    return []


def token_windows(tokenizer: Any, text: EvalText, max_tokens: int, context: int) -> list[np.ndarray]:
    """The first MAX_TOKENS text tokens, cut into consecutive windows of at most CONTEXT ids.

    Each window is the tokenizer's special prefix + a run of text tokens: int64 [n <= context].
    A last window too short to predict anything is dropped.
    """
    import numpy as np

    if max_tokens < 2:
        raise InputError(f"--max-tokens must be at least 2 (one token predicts the next), got {max_tokens}")
    prefix = special_prefix(tokenizer)
    if context < len(prefix) + 2:
        raise InputError(f"context {context} is too short: a window needs the {len(prefix)} special token(s) "
                         f"the tokenizer adds and 2 text tokens; pass a larger --context")
    # verbose=False: the whole text may exceed model_max_length; only its first max_tokens are used
    ids = tokenizer(text.text, add_special_tokens=False, verbose=False)["input_ids"][:max_tokens]
    per_window = context - len(prefix)
    windows = [np.asarray(prefix + ids[i:i + per_window], np.int64) for i in range(0, len(ids), per_window)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise InputError(f"eval text {text.source} has {len(ids)} token(s); it needs at least 2 to score one "
                         f"prediction: pass a longer --text")
    return windows
