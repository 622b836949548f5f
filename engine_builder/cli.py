"""The `trtbuild` command line: a thin layer over the library functions of the same names."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from engine_builder.errors import TrtbuildError

app = typer.Typer(
    help="Turn Hugging Face LLM checkpoints into TensorRT engines ahead of time, and run them.\n\n"
         "\b\n  trtbuild convert  <hf-dir-or-gguf> <ckpt-dir>\n"
         "  trtbuild build    <ckpt-dir> <engine-dir>\n"
         "  trtbuild run      <engine-dir> --prompt '...'",
    no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False)
stderr = Console(stderr=True)
stdout = Console()
_state = {"debug": False}


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False) -> None:
    _state["debug"] = debug


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn user errors (TrtbuildError, OSError) and Ctrl-C into one line on stderr and exit code 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrtbuildError as exc:
            if _state["debug"]:
                raise
            stderr.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as exc:  # disk full, permission denied...: the user's environment, not a bug
            if _state["debug"]:
                raise
            stderr.print(f"error: {exc}; check the path, its permissions and free space",
                         markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            if _state["debug"]:
                raise
            stderr.print("interrupted: nothing was written", markup=False, highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def print_json(obj: Any) -> None:
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def byte_progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=stderr, disable=not enabled, transient=True)


@app.command()
@user_errors
def convert(
    src: Annotated[Path, typer.Argument(help="HF model dir (config.json + *.safetensors) or a .gguf file.")],
    out: Annotated[Path, typer.Argument(help="Checkpoint dir to create.")],
    dtype: Annotated[str, typer.Option(help="Weight dtype: auto (keep the source's; float32 for GGUF), "
                                            "float32, float16 or bfloat16.")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the tensor name mapping; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Convert an HF checkpoint or GGUF file into a canonical trtbuild checkpoint.

    Tensors are streamed one at a time (q/k/v and gate/up fused), so memory stays near the
    size of the largest tensor. OUT is written to a temp dir and renamed at the end.

    Example: trtbuild convert ./SmolLM2-135M-Instruct ckpt --dtype float16
    """
    from converters.convert import convert as convert_checkpoint
    from converters.convert import plan

    if dry_run:
        cp = plan(src, dtype)
        rows = [{"canonical": t.name, "sources": list(t.sources), "shape": list(t.shape), "dtype": cp.dtype}
                for t in cp.plan.tensors]
        if as_json:
            print_json({"model_type": cp.model.architecture, "tensors": rows, "dropped": list(cp.plan.dropped)})
            return
        table = Table("source tensor(s)", "canonical tensor", "shape", title=f"{cp.model.architecture}: "
                      f"{len(rows)} canonical tensors, dtype {cp.dtype}")
        for r in rows:
            table.add_row("\n".join(r["sources"]), r["canonical"], "×".join(map(str, r["shape"])))
        for name in cp.plan.dropped:
            table.add_row(name, "(dropped on purpose)", "")
        stdout.print(table)
        return
    with byte_progress(enabled=not as_json) as progress:
        task = progress.add_task("converting", total=None)
        result = convert_checkpoint(src, out, dtype=dtype, force=force,
                                    progress=lambda n, total: progress.update(task, advance=n, total=total))
    if as_json:
        print_json(result)
    else:
        stdout.print(f"wrote {result.out}: {result.model_type}, {result.tensors} tensors, "
                  f"{result.bytes / 1e6:.1f} MB {result.dtype} in {result.seconds:.1f}s "
                  f"({result.mb_per_s:.0f} MB/s, peak RSS +{result.peak_rss_bytes / 1e6:.0f} MB)")


if __name__ == "__main__":
    app()
