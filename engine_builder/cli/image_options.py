"""`--limit-mm-per-prompt`, `--max-image-bytes` and `--max-image-pixels` on serve, run and chat: what a request's
images may be (runner/vision/image_limits.py parses them; a bad value is one line, exit 2). Over a limit, serve
answers 400, run and chat refuse in one line."""

from __future__ import annotations

from typing import Annotated

import typer

LimitMmPerPrompt = Annotated[str | None, typer.Option(
    "--limit-mm-per-prompt", help="Images per request of a vision-language engine, as JSON (vLLM's flag): "
                                  "'{\"image\": 4}'; 0 takes none. More is refused. Default: 8.",
    show_default=False)]
MaxImageBytes = Annotated[str | None, typer.Option(
    "--max-image-bytes", help="Largest encoded image (a file, a data URL's decoded bytes), e.g. 5MiB; larger is "
                              "refused. Default: 20MiB. (serve: a data URL also counts against --max-request-bytes)",
    show_default=False)]
MaxImagePixels = Annotated[int | None, typer.Option(
    "--max-image-pixels", help="Most pixels (width x height) of one image, read from its header before any pixel "
                               "is decoded; more is refused. Default: 36000000.", show_default=False)]
