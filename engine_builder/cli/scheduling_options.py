"""`--async-scheduling` on run, chat and serve: the torch backend's overlap of the host's work with the GPU's."""

from __future__ import annotations

from typing import Annotated

import typer

AsyncScheduling = Annotated[bool | None, typer.Option(
    "--async-scheduling/--no-async-scheduling",
    help="The torch backend on a GPU: launch each decode step before the last step's tokens reach the host, so "
         "detokenizing, stop checks and scheduling overlap the GPU's work (vLLM's flag). The same tokens. Default: "
         "on where the torch backend runs on a GPU without --speculative, off elsewhere.", show_default=False)]
