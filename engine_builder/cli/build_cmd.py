"""`trtbuild build`: checkpoint dir (or exported ONNX) -> engine dir with the TensorRT engine and its twin."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine_builder.cli.console import print_json, progress_mode, stderr, stdout, verbose
from engine_builder.util.atomic_dir import check_apart
from engine_builder.util.errors import InputError


def build(
    ckpt: Annotated[Path | None, typer.Argument(help="Checkpoint dir from `trtbuild convert`.")] = None,
    out: Annotated[Path | None, typer.Argument(help="Engine dir to create.")] = None,
    target: Annotated[str, typer.Option(help="tensorrt, onnxruntime or all. The onnxruntime twin "
                                             "(model.onnx) is always written.")] = "all",
    dtype: Annotated[str | None, typer.Option(help="Compute dtype: float16 (default), bfloat16, float32.")] = None,
    max_batch: Annotated[int | None, typer.Option(help="Largest batch the engine serves (default 8).")] = None,
    max_input_len: Annotated[int | None, typer.Option(help="Longest prompt (default 1024).")] = None,
    max_seq_len: Annotated[int | None, typer.Option(help="KV slots per sequence: prompt + output "
                                                         "(default 2048).")] = None,
    cc: Annotated[str | None, typer.Option(help="TensorRT compute capability targets, e.g. sm80,sm86,sm89,sm120 "
                                                "(the default). TensorRT-RTX cannot target sm90.")] = None,
    opt_level: Annotated[int | None, typer.Option(help="TensorRT builder optimization level 0-5 (default 3).")] = None,
    weights: Annotated[str | None, typer.Option(help="embedded (default), refittable, or stripped: the engine "
                                                     "omits the checkpoint's weights and is refitted at load "
                                                     "(needs a GPU at build time with TensorRT-RTX 1.7).")] = None,
    recipe: Annotated[Path | None, typer.Option(help="YAML recipe with build settings (see recipes/). Its "
                                                     "optional fidelity: block gates the build on `trtbuild eval` "
                                                     "figures of the onnxruntime twin.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a setting: key=value, e.g. "
                                                   "limits.max_seq_len=4096 or passes.tensorrt=[...].")] = None,
    trt_flavour: Annotated[str | None, typer.Option(help="auto (tensorrt if installed, else tensorrt_rtx), "
                                                         "tensorrt or tensorrt_rtx.")] = None,
    onnx: Annotated[Path | None, typer.Option(help="Run the passes on a third-party decoder ONNX (e.g. from "
                                                   "torch.onnx.export) instead of a checkpoint: "
                                                   "trtbuild build --onnx model.onnx OUT.")] = None,
    kv_layout: Annotated[str | None, typer.Option(help="KV cache of the graphs: slots (default; one max-seq-len "
                                                       "row per sequence) or paged (a block pool read through "
                                                       "a block table, for block sharing).")] = None,
    kv_block_size: Annotated[int | None, typer.Option(help="Tokens per KV block with --kv-layout paged "
                                                           "(default 16).")] = None,
    twin_accuracy: Annotated[str | None, typer.Option(help="Quantized linears of the onnxruntime twin: auto "
                                                           "(default: int8 activations in a float32 twin, float "
                                                           "ones for --quant gguf's block offsets: exact), exact "
                                                           "(float activations everywhere) or draft (int8 "
                                                           "activations for block offsets too: faster, not exact; "
                                                           "for a --speculative draft engine, whose tokens the "
                                                           "target verifies). TensorRT is not affected.")] = None,
    explain_passes: Annotated[bool, typer.Option("--explain-passes", help="Print per-pass match counts and, "
                                                 "for passes that matched nothing, the closest failure.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Build an engine dir from a checkpoint: decoder graph, rewrite passes, TensorRT engine, ONNX twin.

    TensorRT-RTX builds engines on machines without a GPU; numerics are checked on the ONNX twin,
    which `trtbuild run` executes where no supported GPU is present.

    Example: trtbuild build ckpt engine --dtype float16 --cc sm86,sm89 --max-seq-len 4096

    A speculative draft of a GGUF's float32 build: trtbuild convert model.gguf ckpt-q4 --quant gguf --lm-head int8,
    then trtbuild build ckpt-q4 engine-draft --twin-accuracy draft
    """
    from engine_builder.formats.build_config import BuildConfig, apply_overrides, load_recipe, parse_set

    loaded = load_recipe(recipe) if recipe else None
    config = loaded.build if loaded else BuildConfig()
    flags: dict[str, Any] = {"dtype": dtype, "limits.max_batch": max_batch, "limits.max_input_len": max_input_len,
                             "limits.max_seq_len": max_seq_len, "opt_level": opt_level, "trt_flavour": trt_flavour,
                             "weights": weights, "kv_layout": kv_layout, "kv_block_size": kv_block_size,
                             "compute_capabilities": cc.split(",") if cc else None}
    if twin_accuracy is not None:
        from engine_builder.formats.twin_accuracy import with_twin_accuracy

        flags["passes.onnxruntime"] = list(with_twin_accuracy(config.passes.onnxruntime, twin_accuracy))
    if target != "all" or not recipe:
        flags["targets"] = ["tensorrt", "onnxruntime"] if target == "all" else [target]
    overrides = {k: v for k, v in flags.items() if v is not None}
    config = apply_overrides(config, {**overrides, **parse_set(set_ or [])})
    config.validate()
    # --force replaces OUT: it must not be, hold or sit inside anything this build reads
    written = (out or ckpt) if onnx is not None else out
    if written is not None:
        check_apart(written, _inputs(None if onnx is not None else ckpt, onnx, recipe, loaded))
    gate = None
    if loaded is not None and loaded.fidelity is not None:  # checks the gate's paths before the build starts
        from engine_builder.eval.gate import fidelity_gate

        gate = fidelity_gate(loaded.fidelity, recipe)
    if onnx is not None:
        if gate is not None:
            raise InputError(f"recipe {recipe} has a fidelity gate, which needs a checkpoint (its tokenizer); "
                             "build from the checkpoint, or use a recipe without a fidelity block")
        from engine_builder.build.third_party import build_third_party

        out = out or ckpt  # `build --onnx model.onnx OUT`: OUT is the only positional
        if out is None:
            raise InputError("missing OUT: trtbuild build --onnx model.onnx OUT")
        with sigterm_as_interrupt():
            result = build_third_party(onnx, out, config, force=force, explain=explain_passes)
    else:
        if ckpt is None or out is None:
            raise InputError("missing arguments: trtbuild build CKPT OUT (see --help)")
        from engine_builder.build.preflight import preflight

        preflight(ckpt, out, config, force)  # refusals in a second, before the graph code is even imported
        from engine_builder.build.parallel_build import build_parallel, sharded
        from engine_builder.build.pipeline import build as build_engine_dir

        with sigterm_as_interrupt(), build_progress(progress_mode()) as (stage, trt_progress):
            if sharded(ckpt):  # `convert --tp/--pp`: one graph per rank and segment (build/parallel_build.py)
                result = build_parallel(ckpt, out, config, force=force, stage=stage)
            else:
                result = build_engine_dir(ckpt, out, config, force=force, explain=explain_passes, stage=stage,
                                          trt_progress=trt_progress, gate=gate)
    if loaded is not None and loaded.runtime is not None:  # the recipe's runtime defaults (formats/runtime_config.py)
        from engine_builder.formats.runtime_config import write_runtime

        write_runtime(Path(result.out), loaded.runtime, recipe)
    if as_json:
        import dataclasses

        from engine_builder.cli.json_summary import build_summary

        print_json(build_summary(dataclasses.asdict(result), explain_passes), one_line_values=True)
        return
    if explain_passes or verbose():
        for target_name, results in result.passes.items():
            table = Table("pass", "matches", "why not", title=f"passes for {target_name}")
            for r in results:
                table.add_row(r["name"], str(r["matches"]), r["why_not"] or "")
            stdout.print(table)
    engine = f", engine {result.engine_bytes / 1e6:.1f} MB" if result.engine_bytes else ""
    twin = f" (twin {result.twin_dtype})" if result.twin_dtype and result.twin_dtype != result.dtype else ""
    stdout.print(f"wrote {result.out}: targets {', '.join(result.targets)}, {result.dtype}{twin}{engine}, "
                 f"{result.seconds:.1f}s, peak RSS +{result.peak_rss_bytes / 1e6:.0f} MB")
    if result.fidelity:
        shown = {k: result.fidelity.get(k) for k in ("ppl", "ppl_ratio", "kl", "top1_agreement")}
        stdout.print("fidelity gate passed: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items() if v is not None))


def _inputs(ckpt: Path | None, onnx: Path | None, recipe: Path | None, loaded: Any) -> list[Path]:
    """Every path the build reads: the checkpoint or ONNX file, the recipe and its gate's reference and text."""
    paths = [p for p in (ckpt, onnx, recipe) if p is not None]
    fidelity = loaded.fidelity if loaded is not None else None
    if recipe is not None and fidelity is not None:
        paths += [Path(recipe).parent / p for p in (fidelity.reference, fidelity.text) if p]
    return paths


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, `kill`) stops the build the way Ctrl-C does: the TensorRT build process
    is killed and the temp output removed, where the default action would leave both behind."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def build_progress(mode: str) -> Iterator[tuple[Callable[[str], None], Callable[[Any], None]]]:
    """A line per build stage, and bars for TensorRT's own phases (from its progress monitor); MODE "lines"
    (not a terminal: CI) writes plain timestamped lines instead, "off" (-q) nothing."""
    if mode == "lines":
        from engine_builder.cli.progress_lines import LineProgress

        lines = LineProgress("build")
        top: dict[str, int] = {}  # top-level TensorRT phase -> its step count

        def on_trt_line(event: Any) -> None:
            # nested phases come and go by the hundred: the top-level phases' steps say enough
            if event.kind == "start" and not event.parent:
                top[event.phase] = event.total
                lines.stage(f"TensorRT: {event.phase}")
            elif event.kind == "step" and event.phase in top:
                total = top[event.phase]
                lines.step(f"TensorRT: {event.phase}", event.step, total if total > 0 else None, " steps")

        yield lines.stage, on_trt_line
        return
    enabled = mode == "bars"
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                        TimeElapsedColumn(), console=stderr, disable=not enabled, transient=True)
    stage_task = progress.add_task("building", total=None)
    phases: dict[str, Any] = {}

    def on_stage(text: str) -> None:
        progress.update(stage_task, description=text)

    nested: set[str] = set()

    def on_trt(event: Any) -> None:
        if event.kind == "start":
            if event.parent:
                nested.add(event.phase)
            phases[event.phase] = progress.add_task(f"{'    ' if event.parent else '  '}TensorRT: {event.phase}",
                                                    total=event.total if event.total > 0 else None)
        elif event.phase in phases:
            progress.update(phases[event.phase], completed=event.step)
            if event.kind == "finish" and event.phase in nested:  # nested phases come and go
                progress.remove_task(phases.pop(event.phase))
        progress.refresh()  # at once: TensorRT's phases can be short

    with progress:
        yield on_stage, on_trt
