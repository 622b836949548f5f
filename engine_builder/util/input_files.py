"""Small files a command reads from a user's dir (config.json, tokenizer files): bounded before reading.

json.loads of a file costs ~30 bytes of RSS per byte of JSON (a 50 MB config.json took 1.4 GB), and a
nesting deeper than Python's stack raises RecursionError, a traceback. So each file is refused over its
bound before any byte is read, and every way it can fail to parse is one InputError (exit 2) that names
the file and says what to do (`fix`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_builder.util.errors import InputError

# An HF config.json is a few KB (Llama 3.1 405B's: 1 KB, a vision model's with its label map: ~100 KB)
MAX_CONFIG_BYTES = 4 << 20
# model.safetensors.index.json names every tensor: DeepSeek-V3's (91k tensors) is 8.9 MB
MAX_INDEX_BYTES = 64 << 20
# The largest tokenizer.json we know is Gemma 3's (33 MB, a 262k vocabulary); each tokenizer file gets this bound
MAX_TOKENIZER_BYTES = 64 << 20


def check_size(path: Path, limit: int, fix: str) -> int:
    """PATH's size in bytes; an InputError when it is over LIMIT (checked with stat, nothing read)."""
    size = Path(path).stat().st_size
    if size > limit:
        raise InputError(f"{path} is {size / 1e6:.1f} MB, over the {limit >> 20} MiB any such file needs; "
                         f"it is not one: {fix}")
    return size


def read_json(path: Path, limit: int, fix: str) -> Any:
    """PATH parsed as JSON, at most LIMIT bytes of it; one InputError however it fails."""
    check_size(path, limit, fix)
    try:
        return json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InputError(f"cannot read {path} ({exc.strerror or exc}); {fix}") from None
    except RecursionError:  # nesting deeper than Python's stack: a traceback otherwise
        raise InputError(f"{path} is not valid JSON (nested too deeply); {fix}") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise InputError(f"{path} is not valid JSON ({exc}); {fix}") from None


def read_json_object(path: Path, limit: int, fix: str) -> dict[str, Any]:
    """read_json, where the file must hold one JSON object ({...})."""
    data = read_json(path, limit, fix)
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise InputError(f"{path} holds {kind}, not a JSON object ({{...}}); {fix}")
    return data
