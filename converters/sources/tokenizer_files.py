"""The tokenizer files of an HF dir, checked before convert copies them.

convert copies them verbatim and `run` is the first to load them, so a junk tokenizer.json used to pass
convert and build and fail at run with a traceback from transformers. Each one is read here as its
loader will read it: tokenizer.json by the `tokenizers` library itself (what transformers wraps; ~10 ms
to import, its Rust parser bounds nesting), the JSON ones as JSON objects, the text ones as UTF-8; all
of them under a size bound first (util/input_files.py).
"""

from __future__ import annotations

from pathlib import Path

from converters.sources.source import TOKENIZER_FILES
from engine_builder.util.errors import InputError
from engine_builder.util.input_files import MAX_TOKENIZER_BYTES, check_size, read_json_object

JSON_OBJECTS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
                "chat_template.json", "generation_config.json")
TEXT = ("vocab.txt", "merges.txt", "chat_template.jinja")  # tokenizer.model is a protobuf: size only


def checked_tokenizer_files(root: Path) -> list[str]:
    """The names of TOKENIZER_FILES present in ROOT, each checked to load; an InputError names the first bad one."""
    present = [name for name in TOKENIZER_FILES if (root / name).is_file()]
    for name in present:
        path = root / name
        fix = (f"replace it with the model's own {name} (re-download it), or delete it to convert without it"
               if name == "generation_config.json" else
               f"replace it with the model's own {name} (re-download the tokenizer files)")
        check_size(path, MAX_TOKENIZER_BYTES, fix)
        if name in JSON_OBJECTS:
            read_json_object(path, MAX_TOKENIZER_BYTES, fix)
        elif name in TEXT:
            _check_utf8(path, fix)
        elif name == "tokenizer.json":
            _check_tokenizer_json(path, fix)
    return present


def _check_utf8(path: Path, fix: str) -> None:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                         f"{fix}") from None


def _check_tokenizer_json(path: Path, fix: str) -> None:
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception for any malformed file
        reason = str(exc).replace("\n", " ")
        raise InputError(f"{path} is not a tokenizer the tokenizers library can load ({reason}); {fix}") from None
