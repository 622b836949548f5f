"""`trtbuild run`: generate from an engine dir, streaming text to stdout.

Registered by cli/commands.py as `app.command("run")(user_errors(run))`; every user mistake here is a
TrtbuildError (InputError / CapacityError / UnsupportedError) with a one-line message, which
that wrapper prints before exiting 2. Sampling values are checked before the engine is loaded,
so a typo fails in milliseconds rather than after seconds of session creation.

stdout carries only the generated text (or, with --json, one JSON object), so the output can be
piped; the backend and timings go to stderr. A constrained answer the grammar engine gave up on mid-way
(finish_reason "error") is printed as far as it got, then its reason on stderr, and run exits 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from engine_builder.cli.console import BACKEND_HELP
from engine_builder.cli.image_options import LimitMmPerPrompt, MaxImageBytes, MaxImagePixels
from engine_builder.cli.kv_options import GpuMemoryUtilization, KVCacheMemory, kv_cache_bytes
from engine_builder.cli.scheduling_options import AsyncScheduling
from engine_builder.util.errors import InputError


def run(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="Prompt text; read from stdin when "
                                                                       "absent.")] = None,
    chat: Annotated[bool | None, typer.Option("--chat/--no-chat", help="Treat the prompt as a user message in "
                                                               "the model's chat template (--no-chat: the raw text "
                                                               "as written). Default: --chat where the tokenizer "
                                                               "has a chat template.", show_default=False)] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Tokens to generate at most (default: "
                                                            "generation_config.json, else 16).")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy. Default: the model's "
                                                           "generation_config.json (greedy unless do_sample).")] = None,
    top_k: Annotated[int | None, typer.Option(help="Keep the k most likely tokens (0 = off).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass in (0, 1] (1 = off).")] = None,
    min_p: Annotated[float | None, typer.Option(help="Drop tokens below min_p x the top probability "
                                                     "(0 = off).")] = None,
    repetition_penalty: Annotated[float | None, typer.Option(help="HF repetition penalty (1 = off).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible sampling.")] = None,
    num_beams: Annotated[int | None, typer.Option(help="Beam search with this many beams (1 = off; "
                                                       "not streamed).")] = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop string; repeat for several.")] = None,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (text, token_ids, finish_reason, "
                                                         "backend, timings) instead of streaming.")] = False,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip checking the engine's files against "
                                                                "the sha256 its build recorded (trusted dirs "
                                                                "only).")] = False,
    embed: Annotated[list[str] | None, typer.Option("--embed", help="Encoder engines: print this text's "
                                                                    "embedding (a JSON array); repeat for "
                                                                    "several.")] = None,
    json_schema: Annotated[Path | None, typer.Option("--json-schema", help="Constrain the output to this JSON "
                                                                            "schema file.")] = None,
    regex: Annotated[str | None, typer.Option("--regex", help="Constrain the output to this regex.")] = None,
    choice: Annotated[list[str] | None, typer.Option("--choice", help="The output is one of these; repeat.")] = None,
    speculative: Annotated[str | None, typer.Option(
        help="Speculative decoding: ngram (prompt lookup), draft (--draft-engine) or off; the same tokens at "
             "temperature 0. Default: the engine's recipe runtime block, else off.")] = None,
    draft_engine: Annotated[Path | None, typer.Option(help="Engine dir drafting for --speculative draft (same "
                                                           "tokenizer, e.g. an int4 build).")] = None,
    num_draft_tokens: Annotated[int | None, typer.Option(help="Draft tokens per verify step (default: adaptive "
                                                              "to the acceptance rate).")] = None,
    prefix_cache: Annotated[bool, typer.Option(help="Reuse cached KV blocks of earlier prompts (onnxruntime "
                                                    "backend; same answers at temperature 0).")] = True,
    kv_cache_memory: KVCacheMemory = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    async_scheduling: AsyncScheduling = None,
    image: Annotated[list[Path] | None, typer.Option(
        "--image", help="An image for a vision-language engine (PNG, JPEG, WebP, GIF); repeat for several. Each "
                        "takes an image token's place in the prompt; with none there, the images go first.")] = None,
    limit_mm_per_prompt: LimitMmPerPrompt = None,
    max_image_bytes: MaxImageBytes = None,
    max_image_pixels: MaxImagePixels = None,
) -> None:
    """Generate text from an engine dir (TensorRT on a supported GPU, else the ONNX twin on CPU).

    Example: trtbuild run engine --prompt "What is the capital of France?" --max-new-tokens 64
    """
    from engine_builder.cli.structured_options import constraint_options
    from engine_builder.runner.backend_choice import BACKENDS
    from engine_builder.runner.sampling_params import SamplingParams

    user = {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "min_p": min_p, "repetition_penalty": repetition_penalty, "seed": seed, "num_beams": num_beams,
            "stop": tuple(stop) if stop else None}
    user = {k: v for k, v in user.items() if v is not None}
    user.update(constraint_options(json_schema, regex, choice))
    SamplingParams(**user)  # invalid values fail here, before the engine is loaded
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    from engine_builder.runner.vision.image_limits import image_limits_from_flags

    image_limits = image_limits_from_flags(limit_mm_per_prompt, max_image_bytes, max_image_pixels)
    for path in image or ():
        if not path.is_file():
            raise InputError(f"--image {path} is not a file; give the path of a PNG, JPEG, WebP or GIF")
    if embed:
        from engine_builder.cli.run_embed import run_embed

        return run_embed(engine_dir, embed, backend, verify=not no_verify, as_json=as_json)
    from engine_builder.runner.parallel import launch

    # tp/pp engine dirs run one process per rank (runner/parallel/); a bad prompt fails before any rank starts
    # (stdin stays rank 0's)
    code = launch.dispatch_ranks(engine_dir, verify=not no_verify,
                                 before_spawn=(lambda: _read_prompt(prompt)) if prompt is not None else None)
    if code is not None:
        raise typer.Exit(code)
    from engine_builder.runner.speculative.speculative_config import from_flags

    spec = from_flags(speculative, draft_engine, num_draft_tokens, engine_dir)  # checked before the engine loads
    memory = kv_cache_bytes(kv_cache_memory)
    text = _read_prompt(prompt)

    from engine_builder.runner.llm import LLM

    llm = LLM(engine_dir, backend=backend, verify=not no_verify, speculative=spec, prefix_cache=prefix_cache,
              kv_cache_memory=memory, gpu_memory_utilization=gpu_memory_utilization, image_limits=image_limits,
              async_scheduling=async_scheduling)
    params = llm.default_params(**user)
    if chat is None:  # an instruct model answers its template; llama.cpp's CLI applies it by default too
        chat = bool(getattr(llm.tokenizer, "chat_template", None))
    images = [str(path) for path in image] if image else None
    if chat:
        stream = llm.stream_chat([{"role": "user", "content": text}], params, images=images)
    else:
        stream = llm.stream(text, params, images=images)
    with stream:
        for delta in stream:
            if not as_json:
                sys.stdout.write(delta)
                sys.stdout.flush()
    out, timings = stream.output, stream.timings
    if as_json:
        from engine_builder.util.version import __version__

        result: dict[str, Any] = {"trtbuild_version": __version__, **out.to_json(),
                                  "backend": llm.backend_name, "backend_reason": llm.backend_reason,
                                  "timings": timings.to_json()}
        if spec is not None:  # acceptance rate, mean accepted length
            result["speculative"] = llm.speculation.stats.to_json()
        sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()  # the answer's last line before the stderr summary, in a terminal too
        sys.stderr.write(f"[{llm.backend_name}] {len(out.token_ids)} tokens, finish {out.finish_reason}, "
                         f"prefill {timings.prefill_ms:.0f} ms, decode {timings.decode_tok_s:.1f} tok/s\n")
    if out.finish_reason == "error":  # the grammar engine gave up mid-answer: the text fails its constraint
        sys.stdout.flush()
        sys.stderr.write(f"error: {out.stop_reason}; the answer is incomplete: simplify the constraint "
                         f"(fewer alternatives, fewer optional keys) and retry\n")
        raise typer.Exit(2)  # as chat exits on a failed turn: a script must not take this answer for a valid one


def _read_prompt(prompt: str | None) -> str:
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no prompt: pass --prompt TEXT or pipe the prompt on stdin")
        stream = getattr(sys.stdin, "buffer", None)
        data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        try:  # bytes decoded here, so a bad byte is one line rather than a traceback
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"the prompt on stdin is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                             f"convert it first, e.g. `iconv -f latin1 -t utf-8 FILE | trtbuild run ...`") from None
        if prompt.endswith("\n"):  # `echo text | trtbuild run`: the shell's newline is not part of it
            prompt = prompt[:-1]
    else:
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:  # argv bytes that were not UTF-8 arrive as lone surrogates (0xDC80-0xDCFF)
            code = ord(prompt[exc.start])
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
            raise InputError(f"--prompt is not UTF-8 ({what} at character {exc.start}); pass UTF-8 text (a UTF-8 "
                             f"terminal locale, or `iconv -t utf-8` on the text) or pipe it on stdin") from None
    if not prompt.strip():
        raise InputError("the prompt is empty; pass --prompt TEXT (or non-empty stdin)")
    return prompt
