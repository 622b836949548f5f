"""The command line (console script `trtbuild` = engine_builder.cli:app). Nothing imports it."""

from engine_builder.cli.commands import app

__all__ = ["app"]
