"""The command line (console script `trtbuild` = engine_builder.cli:app). Nothing imports it."""

from engine_builder.cli.huge_pages import restart_with_huge_pages

restart_with_huge_pages()  # before anything allocates: glibc reads its tunables at process start only

from engine_builder.cli.commands import app  # noqa: E402

__all__ = ["app"]
