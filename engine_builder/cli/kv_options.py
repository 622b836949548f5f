"""`--kv-cache-memory SIZE` on run, chat and serve: the bytes of a paged engine's block pool."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_builder.util.byte_size import parse_byte_size

KVCacheMemory = Annotated[str | None, typer.Option(
    "--kv-cache-memory", help="Bytes of the KV block pool of a paged engine (`build --kv-layout paged`), e.g. 2GiB "
                              "or 512MiB; it bounds how many tokens running and cached prompts hold. Default: a "
                              "quarter of the available RAM.")]


def kv_cache_bytes(text: str | None) -> int | None:
    return None if text is None else parse_byte_size(text, "--kv-cache-memory")
