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

stderr = Console(stderr=True)
stdout = Console()
state = {"debug": False}


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


def print_json(obj: Any) -> None:
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
