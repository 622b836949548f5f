"""The text `trtbuild eval` scores, and how it is cut into windows of token ids.

    text = load_text(None)                                   # the shipped engine_builder/data/eval.txt
    text = load_text(Path("mine.jsonl"))                     # one {"text": ...} object per line
    windows = token_windows(tokenizer, text, max_tokens=1024, context=256)

Each window is scored the way Hugging Face's causal-LM loss scores `model(ids, labels=ids)`:
position t predicts token t+1, so a window of n tokens yields n-1 predictions and its first
token is context only. Windows do not overlap, so every text token is predicted at most once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine_builder.errors import InputError

if TYPE_CHECKING:  # numpy loads with the scorer, not when the CLI starts
    import numpy as np

BUILTIN = "eval.txt"
DEFAULT_MAX_TOKENS = 1024
# 256 positions: 4 windows of the default 1024 tokens, which run side by side in the KV slots of
# any engine with max_batch >= 4, so one engine call scores 4 positions (CPU decode steps cost
# far less than 4x at batch 4). Longer windows lower the perplexity but not the comparison.
DEFAULT_CONTEXT = 256
# jsonl documents are joined like paragraphs, so a window may span two of them as it would in a book
_DOC_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class EvalText:
    text: str
    source: str  # the path given, or "builtin:eval.txt"


def load_text(path: Path | None) -> EvalText:
    """The text of PATH (.txt raw, .jsonl a "text" field per line); None = the shipped text."""
    if path is None:
        return EvalText((resources.files("engine_builder") / "data" / BUILTIN).read_text("utf-8"), f"builtin:{BUILTIN}")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"eval text {path} does not exist; pass a .txt or .jsonl file to --text, or leave it out "
                         f"to use the shipped text")
    try:
        raw = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read eval text {path} ({exc}); pass a readable UTF-8 .txt or .jsonl file") from None
    text = _jsonl_text(path, raw) if path.suffix.lower() == ".jsonl" else raw
    if not text.strip():
        raise InputError(f"eval text {path} is empty; pass a file with at least a few hundred words of text")
    return EvalText(text, str(path))


def _jsonl_text(path: Path, raw: str) -> str:
    docs = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path} line {number} is not JSON ({exc}); each line of a .jsonl eval file must be "
                             f"an object with a \"text\" field") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"{path} line {number} has no string \"text\" field; each line of a .jsonl eval file "
                             f"must look like {{\"text\": \"...\"}}")
        docs.append(record["text"])
    return _DOC_SEPARATOR.join(docs)


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
