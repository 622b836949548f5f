"""What every command shares: the two consoles, `--debug`, the one-line user-error wrapper, JSON output."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import typer
from rich.console import Console

from engine_builder.util.errors import TrtbuildError
from engine_builder.util.version import __version__

# not a terminal (a CI log, a pipe): no wrapping at rich's default 80 columns; a log line stays one line
stderr = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
state: dict[str, Any] = {"debug": False, "verbosity": 0}  # verbosity: -1 with -q, 1 with -v


def quiet() -> bool:
    return state["verbosity"] < 0


def verbose() -> bool:
    return state["verbosity"] > 0


def progress_mode() -> str:
    """"off" (-q), "bars" (rich, redrawn in place on a terminal) or "lines" (plain lines for CI logs,
    cli/progress_lines.py). Progress goes to stderr, so --json output on stdout stays parseable."""
    if quiet():
        return "off"
    from engine_builder.cli.progress_lines import is_terminal

    return "bars" if is_terminal(sys.stderr) else "lines"


def one_line(exc: BaseException) -> str:
    """The error's text on one line whatever it quotes (a file name or key with a newline in it): CI greps it."""
    return str(exc).replace("\r", "\\r").replace("\n", "\\n")


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors (TrtbuildError, OSError) and Ctrl-C into one line on stderr and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrtbuildError as exc:
            if state["debug"]:
                raise
            stderr.print(f"error: {one_line(exc)}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as exc:  # disk full, permission denied...: the user's environment, not a bug
            if state["debug"]:
                raise
            stderr.print(f"error: {one_line(exc)}; check the path, its permissions and free space",
                         markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            if state["debug"]:
                raise
            stderr.print("interrupted: nothing was written", markup=False, highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def print_json(obj: Any, one_line_values: bool = False) -> None:
    """OBJ as indented JSON on stdout, with the trtbuild version that made it (a bug report's first question).

    one_line_values: each top-level key on one line, its value (however nested) compact beside it, so a
    summary stays a screenful however many passes, files or limits it lists."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        obj = {"trtbuild_version": __version__, **obj}
    if one_line_values and isinstance(obj, dict):
        items = [f"  {json.dumps(k)}: {json.dumps(v, default=str, ensure_ascii=False)}" for k, v in obj.items()]
        sys.stdout.write("{\n" + ",\n".join(items) + "\n}\n")
        return
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")

# --backend's help, the same on run, chat, serve and eval
BACKEND_HELP = ("auto (TensorRT when the engine can run here, else PyTorch on a CUDA GPU, else the onnxruntime twin), "
                "tensorrt, torch (on a CPU too, in float32) or onnxruntime.")
