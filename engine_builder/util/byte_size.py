"""Sizes in bytes as users type them on the command line: `2GiB`, `512MiB`, `1.5GB`, `1000000`."""

from __future__ import annotations

import re

from engine_builder.util.errors import InputError

# binary units as vLLM's and llama.cpp's docs mean them (GiB = 2**30); decimal ones for what disks print
UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
         "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}
PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def parse_byte_size(text: str, flag: str) -> int:
    """A positive whole number of bytes from TEXT; FLAG names the option in the error."""
    match = PATTERN.fullmatch(text.lower())
    size = int(float(match.group(1)) * UNITS[match.group(2)]) if match and match.group(2) in UNITS else 0
    if size < 1:
        raise InputError(f"{flag} {text!r} is not a size: give bytes or a number with KiB, MiB or GiB, e.g. 2GiB")
    return size
