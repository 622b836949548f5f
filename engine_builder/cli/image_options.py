"""`--limit-mm-per-prompt`, `--max-image-bytes` and `--max-image-pixels` on serve: what a request's images may be
(runner/vision/image_limits.py parses them; a bad value is one line, exit 2)."""

from __future__ import annotations

from typing import Annotated

import typer

LimitMmPerPrompt = Annotated[str | None, typer.Option(
    "--limit-mm-per-prompt", help="Images per request of a vision-language engine, as JSON (vLLM's flag): "
                                  "'{\"image\": 4}'; 0 takes none. More is refused (400). Default: 8.",
    show_default=False)]
MaxImageBytes = Annotated[str | None, typer.Option(
    "--max-image-bytes", help="Largest encoded image (a data URL's decoded bytes), e.g. 5MiB; larger is refused "
                              "(400). Default: 20MiB. A data URL also counts against --max-request-bytes.",
    show_default=False)]
MaxImagePixels = Annotated[int | None, typer.Option(
    "--max-image-pixels", help="Most pixels (width x height) of one image, read from its header before any pixel "
                               "is decoded; more is refused (400). Default: 36000000.", show_default=False)]
