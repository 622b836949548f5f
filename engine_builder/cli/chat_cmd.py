"""`trtbuild chat ENGINE_DIR`: a multi-turn conversation on stdin / stdout, the history kept in the KV cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from engine_builder.cli.console import BACKEND_HELP, verbose
from engine_builder.cli.image_options import LimitMmPerPrompt, MaxImageBytes, MaxImagePixels
from engine_builder.cli.kv_options import GpuMemoryUtilization, KVCacheMemory, kv_cache_bytes
from engine_builder.cli.scheduling_options import AsyncScheduling
from engine_builder.util.errors import TrtbuildError

HELP = ("commands: /image PATH attaches an image to your next message (vision-language engines), /reset forgets "
        "the conversation, /exit (or Ctrl-D) leaves")


def chat(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    system: Annotated[str | None, typer.Option(help="System message that opens the conversation.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer per turn, in tokens (capped at what the "
                                                     "engine's max_seq_len leaves after the conversation).")] = 256,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy; default: the engine's "
                                                           "generation_config.json (greedy without one).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (with a temperature > 0).")] = None,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    speculative: Annotated[str | None, typer.Option(
        help="Speculative decoding: ngram (prompt lookup), draft (--draft-engine) or off; the same answers at "
             "temperature 0. Default: the engine's recipe runtime block, else off.")] = None,
    draft_engine: Annotated[Path | None, typer.Option(help="Engine dir drafting for --speculative draft (same "
                                                           "tokenizer, e.g. an int4 build).")] = None,
    num_draft_tokens: Annotated[int | None, typer.Option(help="Draft tokens per verify step (default: adaptive "
                                                              "to the acceptance rate).")] = None,
    prefix_cache: Annotated[bool, typer.Option(help="Keep the conversation's KV between turns, so each turn "
                                                    "prefills only what is new (onnxruntime backend).")] = True,
    kv_cache_memory: KVCacheMemory = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    async_scheduling: AsyncScheduling = None,
    limit_mm_per_prompt: LimitMmPerPrompt = None,
    max_image_bytes: MaxImageBytes = None,
    max_image_pixels: MaxImagePixels = None,
) -> None:
    """Chat with the model: each line on stdin is a turn, the answer streams to stdout.

    The conversation stays in the KV cache between turns, so each turn prefills only what is new
    (`trtbuild -v chat ...` prints the prompt and prefilled tokens per turn on stderr). /image PATH
    attaches an image to the next message (vision-language engines), /reset starts over, /exit or end of
    input leaves.

    Example: trtbuild chat engine --system "You are a concise assistant."
    """
    from engine_builder import LLM
    from engine_builder.runner.chat_session import ChatSession
    from engine_builder.runner.speculative.speculative_config import from_flags
    from engine_builder.runner.vision.image_limits import image_limits_from_flags

    spec = from_flags(speculative, draft_engine, num_draft_tokens, engine_dir)  # checked before the engine loads
    memory = kv_cache_bytes(kv_cache_memory)
    image_limits = image_limits_from_flags(limit_mm_per_prompt, max_image_bytes, max_image_pixels)
    llm = LLM(engine_dir, backend=backend, speculative=spec, prefix_cache=prefix_cache, kv_cache_memory=memory,
              gpu_memory_utilization=gpu_memory_utilization, image_limits=image_limits,
              async_scheduling=async_scheduling)
    session = ChatSession(llm, system, llm.default_params(max_new_tokens=max_new_tokens, temperature=temperature,
                                                          seed=seed))
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stderr.write(f"[{llm.backend_name}] {HELP}\n")
    turn = failed = 0
    attached: list[str] = []  # /image paths for the next message
    try:
        while True:
            if interactive:
                sys.stderr.write(">>> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line or line.strip() == "/exit":
                break
            text = line.strip()
            if not text:
                continue
            if text == "/reset":
                session.reset()
                attached = []
                sys.stderr.write("(conversation reset)\n")
                continue
            if text.split()[0] == "/image":
                path = Path(text[len("/image"):].strip())
                if llm.engine.model.vision is None:
                    sys.stderr.write("error: this engine is text-only; it takes no images\n")
                elif not path.is_file():
                    sys.stderr.write(f"error: {path} is not a file; /image PATH takes a PNG, JPEG, WebP or GIF\n")
                else:
                    attached.append(str(path))
                    sys.stderr.write(f"(image {path} goes with your next message)\n")
                continue
            if text.startswith("/"):
                sys.stderr.write(f"unknown command {text.split()[0]}; {HELP}\n")
                continue
            turn += 1
            images, attached = attached, []
            try:
                for delta in session.send(text, images):
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            except TrtbuildError as exc:  # e.g. the conversation outgrew max_seq_len: say so, keep the REPL
                sys.stderr.write(f"error: {exc}; /reset starts a new conversation\n")
                failed += 1
                continue
            sys.stdout.write("\n")
            sys.stdout.flush()
            if verbose() and session.last is not None:
                s = session.last
                sys.stderr.write(f"[turn {turn}: prompt {s.prompt_tokens} tokens, prefilled {s.prefilled_tokens} "
                                 f"(reused {s.reused_tokens}), {s.prefill_ms:.0f} ms; {s.new_tokens} new tokens in "
                                 f"{s.decode_seconds:.2f} s{_speculation(llm)}]\n")
    finally:
        llm.close()
    if failed:  # a script piping turns in learns that some got no answer
        sys.stderr.write(f"{failed} of {turn} turns failed\n")
        raise typer.Exit(2)


def _speculation(llm) -> str:
    """`-v`: the acceptance so far (LLM.speculation's stats, per turn: each turn is a run)."""
    if llm.speculation is None:
        return ""
    stats = llm.speculation.stats
    return (f"; speculative {stats.method}: {stats.accepted_tokens}/{stats.draft_tokens} drafts accepted, "
            f"{stats.mean_accepted_length:.2f} tokens per verify step")
