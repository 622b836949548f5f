"""`trtbuild convert`: HF dir or GGUF -> checkpoint dir, optionally quantized."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from engine_builder.cli.console import print_json, progress_mode, stderr, stdout


def convert_progress(mode: str) -> tuple[Any, Callable[[str, int, int], None]]:
    """A bar per convert stage and the `progress(stage, n, total)` callback that drives them: bytes for
    converting and quantizing, windows of text for calibrating. MODE "lines" (not a terminal: CI) writes
    plain timestamped lines instead (cli/progress_lines.py), "off" (-q) nothing."""
    if mode == "lines":
        import contextlib

        from engine_builder.cli.progress_lines import LineProgress

        lines = LineProgress("convert")
        done: dict[str, int] = {}

        def line(stage: str, n: int, total: int) -> None:
            done[stage] = n if stage == "calibrating" else done.get(stage, 0) + n
            if stage == "calibrating":
                lines.step(stage, done[stage], total, " windows")
            else:
                lines.step(stage, done[stage] / 1e6, total / 1e6, " MB")

        return contextlib.nullcontext(), line
    enabled = mode == "bars"
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
    lm_head: Annotated[str | None, typer.Option(
        "--lm-head", metavar="float|int8|same",
        help="How a quantized checkpoint stores lm_head: int8 (per output channel; the default for the "
             "weight-only schemes int8_wo, int4_wo and int4_awq: most of the fidelity of float at a quarter of "
             "its bytes), float (as --exclude lm_head), or same (as the body, e.g. int4). With --quant gguf: "
             "int8 only, an int8 head beside the file's blocks, one scale per 32 inputs (a Q8_0 head exactly; a "
             "speculative draft's: see `build --twin-accuracy draft`).")] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel ranks: shard heads, MLP and vocab over N "
                                                 "rank{i}.safetensors (llama-family decoders).")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel stages: split the layers over M stages.")] = 1,
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
      trtbuild convert model.gguf ckpt-int8 --quant int8_wo --lm-head float
      trtbuild convert model.gguf ckpt-int4 --quant int4_awq --group-size 64 --calib my-text.jsonl
      trtbuild convert model.Q4_1.gguf ckpt-q4 --quant gguf
      trtbuild convert model.Q4_1.gguf ckpt-q4-draft --quant gguf --lm-head int8
    """
    from converters.quantize.quant_options import QuantOptions

    # the flags alone refused first: converters.convert's imports (numpy, the source readers, the writers) were
    # most of such a refusal's time; convert() checks them again for library callers
    QuantOptions(quant, group_size, kv_cache, calib, calib_samples, calib_seq_len, tuple(exclude or ()),
                 lm_head).validate()
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
    progress, on_progress = convert_progress(progress_mode())
    with progress:
        result = convert_checkpoint(src, out, dtype=dtype, force=force, quant=quant, group_size=group_size,
                                    kv_cache=kv_cache, calib=calib, calib_samples=calib_samples,
                                    calib_seq_len=calib_seq_len, exclude=exclude or (), progress=on_progress,
                                    lm_head=lm_head, tp=tp, pp=pp)
    if as_json:
        print_json(result)
        return
    quantized = (f", {result.quantization}: {result.quantized} linears quantized, {len(result.excluded)} kept float"
                 if result.quantization != "none" else "")
    quantized += f", {result.kv_cache} KV cache" if result.kv_cache != "none" else ""
    stdout.print(f"wrote {result.out}: {result.model_type}, {result.tensors} tensors, "
                 f"{result.bytes / 1e6:.1f} MB {result.dtype}{quantized} in {result.seconds:.1f}s "
                 f"({result.mb_per_s:.0f} MB/s, peak RSS +{result.peak_rss_bytes / 1e6:.0f} MB)")
    if result.precision:
        stdout.print("precision: " + "; ".join(f"{group} {text}" for group, text in result.precision.items()),
                     markup=False, highlight=False)
