"""Plain text for calibration and evaluation: the shipped texts, a user's .txt, or a .jsonl.

`what` names the use in messages ("calibration text" / "eval text") and `flag` the option that
took the path, so each command's errors say what to pass instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine_builder.util.errors import InputError

# jsonl documents are joined like paragraphs, so a window may span two of them as it would in a book
DOC_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class TextFile:
    text: str
    source: str  # the path given, or "builtin:<name>"
    sha256: str  # of the file's bytes


def builtin_text(name: str) -> TextFile:
    """A text shipped in engine_builder/data/ (see its README.md for the source)."""
    data = (resources.files("engine_builder") / "data" / name).read_bytes()
    return TextFile(data.decode("utf-8"), f"builtin:{name}", hashlib.sha256(data).hexdigest())


def read_text_file(path: Path, what: str, flag: str) -> TextFile:
    """PATH as text: .jsonl is one {"text": ...} object per line, anything else is read as it is."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; pass a .txt or .jsonl file to {flag}, or leave it out "
                         f"to use the shipped text")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path} ({exc.strerror or exc}); pass a readable UTF-8 .txt or .jsonl "
                         f"file to {flag}, or leave it out to use the shipped text") from None
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        fixed = f"{path.stem}.utf8{path.suffix}"
        raise InputError(f"{what} {path} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}, line "
                         f"{line}); convert it (e.g. `iconv -f latin1 -t utf-8 {path.name} > {fixed}`) and pass that "
                         f"to {flag}") from None
    text = _jsonl_text(path, raw, what) if path.suffix.lower() == ".jsonl" else raw
    if not text.strip():
        raise InputError(f"{what} {path} is empty; pass a file with at least a few hundred words of text to "
                         f"{flag}, or leave it out to use the shipped text")
    return TextFile(text, str(path), hashlib.sha256(data).hexdigest())


def _jsonl_text(path: Path, raw: str, what: str) -> str:
    docs = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path} line {number} is not JSON ({exc}); each line of a .jsonl {what} file must "
                             f"be an object with a \"text\" field") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"{path} line {number} has no string \"text\" field; each line of a .jsonl {what} "
                             f"file must look like {{\"text\": \"...\"}}")
        try:  # a JSON escape ("\\udc80") can smuggle in a lone surrogate, which no tokenizer takes
            record["text"].encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{path} line {number} has a \"text\" with a lone surrogate escape (\\ud800-\\udfff), "
                             f"which is not text; fix that line of the {what} file") from None
        docs.append(record["text"])
    return DOC_SEPARATOR.join(docs)
