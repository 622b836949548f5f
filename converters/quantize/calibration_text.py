"""The text that calibrated schemes (int4_awq, w8a8_sq, fp8) take activation statistics from.

    text = load(None)                                    # the shipped engine_builder/data/calibration.txt
    text = load(Path("mine.jsonl"))                      # one {"text": ...} object per line
    ids = windows(text, ckpt_dir, samples=16, seq_len=256)  # [n <= samples, seq_len] token ids

The source and its sha256 go into config.json (CalibrationInfo), so a quantized checkpoint
says which text it was tuned on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from engine_builder.errors import InputError

BUILTIN = "calibration.txt"
# jsonl documents are joined like paragraphs, so a window may span two of them as it would in a book
_DOC_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class CalibrationText:
    text: str
    source: str  # the file's name, or "builtin:calibration.txt"
    sha256: str  # of the file's bytes


def load(path: Path | None) -> CalibrationText:
    """The calibration text of PATH (.txt raw, .jsonl a "text" field per line); None = the shipped text."""
    if path is None:
        data = (resources.files("engine_builder") / "data" / BUILTIN).read_bytes()
        return CalibrationText(data.decode("utf-8"), f"builtin:{BUILTIN}", hashlib.sha256(data).hexdigest())
    path = Path(path)
    try:
        data = path.read_bytes()
        raw = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read calibration text {path} ({exc}); pass a readable UTF-8 .txt or .jsonl "
                         f"file to --calib, or leave it out to use the shipped text") from exc
    text = _jsonl_text(path, raw) if path.suffix.lower() == ".jsonl" else raw
    if not text.strip():
        raise InputError(f"calibration text {path} is empty; pass a file with a few thousand words of text "
                         f"typical of the model's use, or leave --calib out to use the shipped text")
    return CalibrationText(text, path.name, hashlib.sha256(data).hexdigest())


def _jsonl_text(path: Path, raw: str) -> str:
    docs = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path} line {number} is not JSON ({exc}); each line of a .jsonl calibration "
                             f"file must be an object with a \"text\" field") from exc
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"{path} line {number} has no string \"text\" field; each line of a .jsonl "
                             f"calibration file must look like {{\"text\": \"...\"}}")
        docs.append(record["text"])
    return _DOC_SEPARATOR.join(docs)


def windows(text: CalibrationText, ckpt_dir: Path, samples: int, seq_len: int) -> np.ndarray:
    """SAMPLES consecutive windows of SEQ_LEN token ids from the start of the text: int64 [n, seq_len].

    Tokenized with the checkpoint's own tokenizer and no special tokens, so every window is
    plain running text. A text too short for SAMPLES windows gives as many as fit (n < samples);
    the caller records n.
    """
    import transformers

    if samples <= 0 or seq_len <= 0:
        raise InputError(f"calibration needs positive --calib-samples and --calib-seq-len, got {samples} "
                         f"and {seq_len}")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt_dir)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer of {ckpt_dir} ({exc}); calibration tokenizes with the "
                         f"checkpoint's tokenizer files, so re-run `trtbuild convert` on a source that has them") \
            from exc
    # verbose=False: the whole text is longer than the model's context, but it is cut into windows below
    ids = tokenizer(text.text, add_special_tokens=False, verbose=False)["input_ids"]
    fit = min(samples, len(ids) // seq_len)
    if fit == 0:
        raise InputError(f"calibration text {text.source} has {len(ids)} tokens, fewer than one window of "
                         f"--calib-seq-len {seq_len}; use a shorter --calib-seq-len or a longer text")
    return np.asarray(ids[:fit * seq_len], np.int64).reshape(fit, seq_len)  # [n, seq_len]
