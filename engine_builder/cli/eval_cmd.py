"""`trtbuild eval`: perplexity of an engine dir, and KL / top-1 agreement against a reference.

Registered by cli/commands.py as `app.command("eval")(user_errors(eval_command))`: user mistakes are
TrtbuildErrors printed on one line with exit code 2. stdout carries the figures (a table, or one
JSON object with --json); the progress bar goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from engine_builder.cli.console import BACKEND_HELP
from engine_builder.eval.text import DEFAULT_CONTEXT, DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from engine_builder.eval.evaluation import ReportProgress


def eval_command(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build` (quantized or not).")],
    reference: Annotated[Path | None, typer.Option(help="Compare against this checkpoint dir (from `trtbuild "
                                                        "convert`, built on the fly as a float32 onnxruntime "
                                                        "engine in a temp dir) or engine dir. Adds the mean "
                                                        "KL(reference || engine) and top-1 agreement.")] = None,
    text: Annotated[Path | None, typer.Option(help="A .txt file, or .jsonl with a \"text\" field per line "
                                                   "(default: the shipped engine_builder/data/eval.txt, "
                                                   "Shakespeare's Julius Caesar).")] = None,
    max_tokens: Annotated[int, typer.Option(help="Score the first N tokens of the text.")] = DEFAULT_MAX_TOKENS,
    context: Annotated[int | None, typer.Option(help=f"Window length in tokens (default {DEFAULT_CONTEXT}, "
                                                     "capped by the engines' max_seq_len). Longer windows "
                                                     "give lower perplexity and take longer.")] = None,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object: ppl, kl, top1_agreement, "
                                                         "tokens, windows, context, text, backend, reference "
                                                         "{path, ppl}, seconds.")] = False,
    tasks: Annotated[str | None, typer.Option(help="Instead of perplexity: lm-eval harness tasks, comma-separated "
                                                   "(e.g. arc_easy,hellaswag), scored through this engine's OpenAI "
                                                   "API (needs `pip install 'lm-eval[api]'`).")] = None,
    include_path: Annotated[Path | None, typer.Option(help="With --tasks: a dir of your own lm-eval task "
                                                           "YAMLs.")] = None,
    limit: Annotated[int | None, typer.Option(help="With --tasks: score at most N documents per task.")] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="With --tasks: few-shot examples per prompt (default: "
                                                         "the task's).")] = None,
) -> None:
    """Measure an engine's fidelity: perplexity on a text, and against a reference the mean KL divergence
    of the next-token distributions and how often both pick the same top token.

    The text's first --max-tokens tokens (the engine's own tokenizer) are cut into windows of --context
    tokens; each position predicts the next token, as Hugging Face's causal-LM loss does. Windows run
    side by side in the engine's KV slots, one token per step, and the reference runs in lockstep.

    Example: trtbuild eval engine-int8 --reference ckpt-fp32 --json
    """
    from engine_builder.cli.console import progress_mode, stdout
    from engine_builder.eval import evaluate

    if tasks is not None:
        return _harness(engine_dir, tasks, include_path, limit, num_fewshot, backend, as_json)
    if include_path is not None or limit is not None or num_fewshot is not None:
        from engine_builder.util.errors import InputError

        raise InputError("--include-path, --limit and --num-fewshot go with --tasks")

    with eval_progress(progress_mode()) as progress:
        result = evaluate(engine_dir, reference=reference, text=text, max_tokens=max_tokens, context=context,
                          backend=backend, progress=progress)
    if as_json:
        from engine_builder.util.version import __version__

        sys.stdout.write(json.dumps({"trtbuild_version": __version__, **result.to_json()}) + "\n")
        return
    from rich.table import Table

    table = Table(show_header=False, title=f"eval of {engine_dir}")
    table.add_row("perplexity", f"{result.ppl:.4f}")
    if result.reference_path is not None:
        table.add_row("reference perplexity", f"{result.reference_ppl:.4f} ({result.reference_path})")
        table.add_row("mean KL(reference || engine)", f"{result.kl:.6f} nats")
        table.add_row("top-1 agreement", f"{result.top1_agreement:.4f}")
    table.add_row("scored", f"{result.tokens} positions in {result.windows} windows of up to {result.context} "
                            f"tokens ({result.text})")
    table.add_row("backend", f"{result.backend}, {result.seconds:.1f}s")
    stdout.print(table)


def _harness(engine_dir: Path, tasks: str, include_path: Path | None, limit: int | None, num_fewshot: int | None,
             backend: str, as_json: bool) -> None:
    """`--tasks`: lm-eval over the engine's OpenAI API (engine_builder/eval/harness_tasks.py)."""
    from engine_builder.cli.console import stdout
    from engine_builder.eval.harness_tasks import run_tasks

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    result = run_tasks(engine_dir, names, include_path=include_path, limit=limit, num_fewshot=num_fewshot,
                       backend=backend)
    if as_json:
        from engine_builder.util.version import __version__

        sys.stdout.write(json.dumps({"trtbuild_version": __version__, **result.to_json()}) + "\n")
        return
    from rich.table import Table

    table = Table("task", "metric", "value", "docs", title=f"lm-eval on {engine_dir} ({result.seconds:.1f}s)")
    for task, metrics in result.results.items():
        for metric, value in metrics.items():
            if isinstance(value, int | float) and "stderr" not in metric:
                table.add_row(task, metric, f"{value:.4f}", str(result.samples.get(task, "")))
    stdout.print(table)


@contextlib.contextmanager
def eval_progress(mode: str) -> Iterator[ReportProgress]:
    """A bar on stderr over the positions to score, labelled with the current stage; plain lines with MODE
    "lines" (not a terminal: CI), nothing with "off" (-q)."""
    from engine_builder.cli.console import stderr

    if mode == "lines":
        from engine_builder.cli.progress_lines import LineProgress

        yield LineProgress("eval").step
        return
    enabled = mode == "bars"
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=stderr, disable=not enabled, transient=True)
    task = bar.add_task("eval", total=None)

    def update(stage: str, done: int, total: int) -> None:
        bar.update(task, description=stage, completed=done, total=total or None)

    with bar:
        yield update
