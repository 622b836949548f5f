"""`python -m engine_builder.cli ...` is `trtbuild ...` (the tests run it this way)."""

from engine_builder.cli.commands import app

app(prog_name="trtbuild")
