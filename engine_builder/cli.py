"""The `trtbuild` command line: a thin layer over the library functions of the same names."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from engine_builder.errors import InputError, TrtbuildError

app = typer.Typer(
    help="Turn Hugging Face LLM checkpoints into TensorRT engines ahead of time, and run them.\n\n"
         "\b\n  trtbuild convert  <hf-dir-or-gguf> <ckpt-dir>\n"
         "  trtbuild build    <ckpt-dir> <engine-dir>\n"
         "  trtbuild run      <engine-dir> --prompt '...'\n"
         "  trtbuild serve    <engine-dir> --port 8000\n"
         "  trtbuild eval     <engine-dir> [--reference <ckpt-dir>]",
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


def convert_progress(enabled: bool) -> tuple[Progress, Callable[[str, int, int], None]]:
    """A bar per convert stage and the `progress(stage, n, total)` callback that drives them: bytes for
    converting and quantizing, windows of text for calibrating."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                        TextColumn("{task.fields[amount]}"), TimeRemainingColumn(), console=stderr,
                        disable=not enabled, transient=True)
    tasks: dict[str, Any] = {}

    def update(stage: str, n: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total, amount="")
        progress.update(tasks[stage], advance=n if stage != "calibrating" else None,
                        completed=n if stage == "calibrating" else None, total=total)
        task = progress.tasks[tasks[stage]]
        amount = (f"{task.completed:.0f}/{total} windows" if stage == "calibrating"
                  else f"{task.completed / 1e6:.0f}/{total / 1e6:.0f} MB")
        progress.update(tasks[stage], amount=amount)

    return progress, update


@app.command()
@user_errors
def convert(
    src: Annotated[Path, typer.Argument(help="HF model dir (config.json + *.safetensors) or a .gguf file.")],
    out: Annotated[Path, typer.Argument(help="Checkpoint dir to create.")],
    dtype: Annotated[str, typer.Option(help="Float dtype of the weights (and of the embeddings, norms and scales "
                                            "when quantizing): auto (keep the source's; float32 for GGUF and "
                                            "with --quant), float32, float16 or bfloat16.")] = "auto",
    quant: Annotated[str, typer.Option(
        metavar="SCHEME",
        help="Weight quantization: none; int8_wo (int8 per output channel, or per --group-size, weight-only); "
             "int4_wo (int4 per group of --group-size inputs, round-to-nearest); int4_awq (int4 with "
             "activation-aware scales from calibration text); w8a8_sq (int8 weights and activations, "
             "SmoothQuant); fp8 (e4m3 weights and activations, per tensor); gguf (a .gguf source's own Q4_0, "
             "Q4_1 and Q4_K blocks kept as they are: int4 in groups of 32, nothing re-quantized, so the engine "
             "computes the GGUF's exact weights; linears of other block types stay float). An AWQ / GPTQ source "
             "is ingested as it is, without --quant.")] = "none",
    group_size: Annotated[int | None, typer.Option(
        metavar="32|64|128",
        help="Input channels per weight scale. int4: default 128. int8_wo: default one scale per output "
             "channel; a group size gives it one per group. Smaller is more accurate and larger on disk; it "
             "must divide every linear's input size (SmolLM2's 576: 64 or 32).")] = None,
    kv_cache: Annotated[str, typer.Option(
        metavar="none|int8|fp8",
        help="KV-cache precision: none (the compute dtype); int8 (per-channel int8 keys and values, a quarter of "
             "a float32 cache, with static scales calibrated on text: see --calib), built with --target "
             "onnxruntime --dtype float32 (TensorRT-RTX 1.7 refuses non-float caches; the build says so). fp8 is "
             "refused: onnxruntime's CPU attention has no fp8-cache kernel and TensorRT-RTX updates only float "
             "caches.")] = "none",
    calib: Annotated[Path | None, typer.Option(
        metavar="FILE",
        help="Calibration text for int4_awq, w8a8_sq, fp8 and --kv-cache int8: a .txt, or a .jsonl with a "
             "\"text\" field per line, typical of the model's use. Default: the shipped public-domain text "
             "(engine_builder/data/calibration.txt).")] = None,
    calib_samples: Annotated[int | None, typer.Option(
        metavar="N", help="Windows of calibration text to prefill (default 32).")] = None,
    calib_seq_len: Annotated[int | None, typer.Option(
        metavar="N", help="Tokens per calibration window (default 256).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(
        metavar="PATTERN", help="Keep the linears matching PATTERN in full precision (repeatable; fnmatch over "
                                "names like lm_head, layers.0.*, *.mlp.down).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the tensor name mapping; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Convert an HF checkpoint or GGUF file into a canonical trtbuild checkpoint, optionally quantized.

    Tensors are streamed one at a time (q/k/v and gate/up fused), so memory stays near the
    size of the largest tensor (plus the activation statistics when calibrating). OUT is
    written to a temp dir and renamed at the end.

    Examples:

    \b
      trtbuild convert ./SmolLM2-135M-Instruct ckpt --dtype float16
      trtbuild convert model.gguf ckpt-int8 --quant int8_wo --exclude lm_head
      trtbuild convert model.gguf ckpt-int4 --quant int4_awq --group-size 64 --calib my-text.jsonl
      trtbuild convert model.Q4_1.gguf ckpt-q4 --quant gguf
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
    progress, on_progress = convert_progress(enabled=not as_json)
    with progress:
        result = convert_checkpoint(src, out, dtype=dtype, force=force, quant=quant, group_size=group_size,
                                    kv_cache=kv_cache, calib=calib, calib_samples=calib_samples,
                                    calib_seq_len=calib_seq_len, exclude=exclude or (), progress=on_progress)
    if as_json:
        print_json(result)
        return
    quantized = (f", {result.quantization}: {result.quantized} linears quantized, {len(result.excluded)} kept float"
                 if result.quantization != "none" else "")
    quantized += f", {result.kv_cache} KV cache" if result.kv_cache != "none" else ""
    stdout.print(f"wrote {result.out}: {result.model_type}, {result.tensors} tensors, "
                 f"{result.bytes / 1e6:.1f} MB {result.dtype}{quantized} in {result.seconds:.1f}s "
                 f"({result.mb_per_s:.0f} MB/s, peak RSS +{result.peak_rss_bytes / 1e6:.0f} MB)")


@app.command()
@user_errors
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
    explain_passes: Annotated[bool, typer.Option("--explain-passes", help="Print per-pass match counts and, "
                                                 "for passes that matched nothing, the closest failure.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Build an engine dir from a checkpoint: decoder graph, rewrite passes, TensorRT engine, ONNX twin.

    TensorRT-RTX builds engines on machines without a GPU; numerics are checked on the ONNX twin,
    which `trtbuild run` executes where no supported GPU is present.

    Example: trtbuild build ckpt engine --dtype float16 --cc sm86,sm89 --max-seq-len 4096
    """
    from engine_builder.build_config import BuildConfig, apply_overrides, load_recipe, parse_set

    loaded = load_recipe(recipe) if recipe else None
    config = loaded.build if loaded else BuildConfig()
    flags: dict[str, Any] = {"dtype": dtype, "limits.max_batch": max_batch, "limits.max_input_len": max_input_len,
                             "limits.max_seq_len": max_seq_len, "opt_level": opt_level, "trt_flavour": trt_flavour,
                             "weights": weights,
                             "compute_capabilities": cc.split(",") if cc else None}
    if target != "all" or not recipe:
        flags["targets"] = ["tensorrt", "onnxruntime"] if target == "all" else [target]
    overrides = {k: v for k, v in flags.items() if v is not None}
    config = apply_overrides(config, {**overrides, **parse_set(set_ or [])})
    gate = None
    if loaded is not None and loaded.fidelity is not None:  # checks the gate's paths before the build starts
        from engine_builder.eval.gate import fidelity_gate

        gate = fidelity_gate(loaded.fidelity, recipe)
    if onnx is not None:
        if gate is not None:
            raise InputError(f"recipe {recipe} has a fidelity gate, which needs a checkpoint (its tokenizer); "
                             "build from the checkpoint, or use a recipe without a fidelity block")
        from engine_builder.third_party import build_third_party

        out = out or ckpt  # `build --onnx model.onnx OUT`: OUT is the only positional
        if out is None:
            raise InputError("missing OUT: trtbuild build --onnx model.onnx OUT")
        result = build_third_party(onnx, out, config, force=force, explain=explain_passes)
    else:
        if ckpt is None or out is None:
            raise InputError("missing arguments: trtbuild build CKPT OUT (see --help)")
        from engine_builder.build import build as build_engine_dir

        with build_progress(enabled=not as_json) as (stage, trt_progress):
            result = build_engine_dir(ckpt, out, config, force=force, explain=explain_passes, stage=stage,
                                      trt_progress=trt_progress, gate=gate)
    if as_json:
        print_json(result)
        return
    if explain_passes:
        for target_name, results in result.passes.items():
            table = Table("pass", "matches", "why not", title=f"passes for {target_name}")
            for r in results:
                table.add_row(r["name"], str(r["matches"]), r["why_not"] or "")
            stdout.print(table)
    engine = f", engine {result.engine_bytes / 1e6:.1f} MB" if result.engine_bytes else ""
    stdout.print(f"wrote {result.out}: targets {', '.join(result.targets)}, {result.dtype}{engine}, "
                 f"{result.seconds:.1f}s, peak RSS +{result.peak_rss_bytes / 1e6:.0f} MB")
    if result.fidelity:
        shown = {k: result.fidelity.get(k) for k in ("ppl", "ppl_ratio", "kl", "top1_agreement")}
        stdout.print("fidelity gate passed: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items() if v is not None))


@contextlib.contextmanager
def build_progress(enabled: bool) -> Iterator[tuple[Callable[[str], None], Callable[[Any], None]]]:
    """A line per build stage, and bars for TensorRT's own phases (from its progress monitor)."""
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
        # TensorRT builds without releasing the GIL, so rich's refresh thread cannot draw: draw here
        progress.refresh()

    with progress:
        yield on_stage, on_trt


@app.command()
@user_errors
def inspect(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a machine-readable summary.")] = False,
) -> None:
    """Show what an engine dir holds and whether it can run on this machine (decided without loading it)."""
    from engine_builder.engine_dir import describe_quantization, quantization_of, summarize

    summary = summarize(engine_dir)
    m = summary.manifest
    if as_json:
        print_json({"path": summary.path, "model": m["model"], "dtype": m["build"]["dtype"],
                    "limits": m["build"]["limits"], "targets": m["targets"], "versions": m["versions"],
                    "passes": m["passes"], "tensorrt": m["tensorrt"], "files": summary.files,
                    "graph_hashes": m["graph_hashes"], "quantization": quantization_of(m),
                    "verdict": {"tensorrt": {"ok": summary.tensorrt_ok, "reason": summary.tensorrt_verdict},
                                "onnxruntime": {"ok": summary.onnxruntime_ok}}})
        return
    model, build_cfg = m["model"], m["build"]
    table = Table(show_header=False, title=f"engine dir {summary.path}")
    table.add_row("model", f"{model['architecture']}: {model['num_layers']} layers, hidden {model['hidden_size']}, "
                           f"{model['num_heads']}/{model['num_kv_heads']} heads, vocab {model['vocab_size']}")
    table.add_row("precision", f"{build_cfg['dtype']} (checkpoint {m['checkpoint']['dtype']})")
    table.add_row("limits", ", ".join(f"{k} {v}" for k, v in build_cfg["limits"].items()))
    table.add_row("targets", ", ".join(m["targets"]))
    if (q := quantization_of(m)) is not None:
        table.add_row("quantization", describe_quantization(q))
    trt = m.get("tensorrt")
    if trt:
        table.add_row("tensorrt", f"{trt['flavour']} {trt['trt_version']}, targets {','.join(trt['targets'])}, "
                                  f"{trt['num_profiles']} profiles, built in {trt['build_seconds']}s")
        table.add_row("layers", ", ".join(f"{k} {v}" for k, v in sorted(trt["network_layer_types"].items())))
    for target_name, results in m["passes"].items():
        table.add_row(f"passes ({target_name})", ", ".join(f"{r['name']} {r['matches']}" for r in results))
    table.add_row("files", ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in summary.files.items()))
    table.add_row("tensorrt here", summary.tensorrt_verdict)
    table.add_row("onnxruntime here", "ok: model.onnx runs on CPU" if summary.onnxruntime_ok else "no model.onnx")
    stdout.print(table)


def _register_run() -> None:
    from engine_builder.cli_run import run

    app.command("run")(user_errors(run))


_register_run()


def _register_serve() -> None:
    from engine_builder.cli_serve import serve

    app.command("serve")(user_errors(serve))


_register_serve()


def _register_eval() -> None:
    from engine_builder.cli_eval import eval_command

    app.command("eval")(user_errors(eval_command))


_register_eval()

if __name__ == "__main__":
    app()
