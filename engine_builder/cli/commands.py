"""The `trtbuild` command line: one module per command, each a thin layer over the library function
of the same keywords; this module only assembles them."""

from __future__ import annotations

from typing import Annotated

import typer

from engine_builder.cli.build_cmd import build
from engine_builder.cli.chat_cmd import chat
from engine_builder.cli.console import state, user_errors
from engine_builder.cli.convert_cmd import convert
from engine_builder.cli.eval_cmd import eval_command
from engine_builder.cli.export_triton_cmd import export_triton
from engine_builder.cli.inspect_cmd import inspect
from engine_builder.cli.plan_cmd import plan
from engine_builder.cli.route_cmd import route
from engine_builder.cli.run_cmd import run
from engine_builder.cli.serve_cmd import serve
from engine_builder.cli.serve_triton_cmd import serve_triton
from engine_builder.cli.verify_cmd import verify
from engine_builder.util.version import __version__

app = typer.Typer(
    help="Turn Hugging Face LLM checkpoints into TensorRT engines ahead of time, and run them.\n\n"
         "\b\n  trtbuild plan     <hf-dir-or-gguf> [--quant ...]\n"
         "  trtbuild convert  <hf-dir-or-gguf> <ckpt-dir>\n"
         "  trtbuild build    <ckpt-dir> <engine-dir>\n"
         "  trtbuild run      <engine-dir> --prompt '...'\n"
         "  trtbuild chat     <engine-dir> [--system '...']\n"
         "  trtbuild serve    <engine-dir> --port 8000\n"
         "  trtbuild eval     <engine-dir> [--reference <ckpt-dir>]",
    no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False)


def _print_version(asked: bool) -> None:
    if asked:
        print(f"trtbuild {__version__}")
        raise typer.Exit()


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
         quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress; errors and results only.")] = False,
         verbose: Annotated[bool, typer.Option("-v", "--verbose", help="More detail: pass tables, per-turn "
                                               "prefill tokens in chat.")] = False,
         version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                               callback=_print_version)] = False) -> None:
    state["debug"] = debug
    state["verbosity"] = -1 if quiet else 1 if verbose else 0


for name, command in (("convert", convert), ("build", build), ("inspect", inspect), ("run", run), ("serve", serve),
                      ("eval", eval_command), ("verify", verify), ("route", route), ("chat", chat),
                      ("plan", plan), ("export-triton", export_triton), ("serve-triton", serve_triton)):
    app.command(name)(user_errors(command))

if __name__ == "__main__":
    app()
