"""The text that calibrated schemes (int4_awq, w8a8_sq, fp8) take activation statistics from.

    text = load(None)                                    # the shipped engine_builder/data/calibration.txt
    text = load(Path("mine.jsonl"))                      # one {"text": ...} object per line
    ids = windows(text, ckpt_dir, samples=16, seq_len=256)  # [n <= samples, seq_len] token ids

The source and its sha256 go into config.json (CalibrationInfo), so a quantized checkpoint
says which text it was tuned on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from engine_builder.util.errors import InputError
from engine_builder.util.text_files import TextFile, builtin_text, read_text_file

BUILTIN = "calibration.txt"
CalibrationText = TextFile  # .text, .source (the file's name, or "builtin:calibration.txt"), .sha256


def load(path: Path | None) -> CalibrationText:
    """The calibration text of PATH (.txt raw, .jsonl a "text" field per line); None = the shipped text."""
    if path is None:
        return builtin_text(BUILTIN)
    text = read_text_file(path, "calibration text", "--calib")
    return dataclasses.replace(text, source=Path(path).name)  # config.json records no local paths


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
