"""Field types shared by the TGI and OpenAI request bodies.

Text: a string that is valid Unicode. JSON lets a string escape a lone UTF-16 surrogate ("\\ud800"),
which Python's json keeps, but which no tokenizer can encode and no response can carry as UTF-8;
refused as a 422 naming the field rather than failing later as a 500.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def _valid_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"the text holds a lone surrogate {value[exc.start]!a} at character {exc.start} "
                         "(not valid Unicode); send UTF-8 text") from None
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
