"""`trtbuild serve`: the HTTP server, a thin layer over engine_builder.server.serve (same keywords).

Registered by cli/commands.py as `app.command("serve")(user_errors(serve))`: a user mistake (port taken,
a limit above the engine's, a bad engine dir) is one line on stderr and exit 2. stdout gets one
line, the URL, once the server accepts connections (scripts wait for it); the start-up summary
goes to stderr. SIGINT/SIGTERM stop it gracefully and it exits 0.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from engine_builder.cli.console import BACKEND_HELP
from engine_builder.cli.image_options import LimitMmPerPrompt, MaxImageBytes, MaxImagePixels
from engine_builder.cli.kv_options import GpuMemoryUtilization, KVCacheMemory, kv_cache_bytes
from engine_builder.cli.scheduling_options import AsyncScheduling
from engine_builder.server.config import (
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_STOP_SEQUENCE_CHARS,
    DEFAULT_MAX_STOP_SEQUENCES,
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_STALLED_STREAM_TIMEOUT_S,
)
from engine_builder.server.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS
from engine_builder.server.http_server import DEFAULT_SHUTDOWN_TIMEOUT_S


def serve(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    host: Annotated[str, typer.Option(help="Interface to listen on; 0.0.0.0 exposes the server to the "
                                           "network (set --api-key then).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one (printed).")] = 8000,
    max_batch: Annotated[int | None, typer.Option(help="Sequences decoded together (in-flight batching); "
                                                       "default and maximum: the engine's max_batch.")] = None,
    max_concurrent_requests: Annotated[int, typer.Option(help="Active requests (running + queued) beyond which "
                                                              "new ones get 429 at once.")]
    = DEFAULT_MAX_CONCURRENT_REQUESTS,
    max_concurrent_per_client: Annotated[int | None, typer.Option(
        help="Requests in flight per client address beyond which its next one gets 429 before its body is read "
             "(default: no hard limit; --client-share keeps clients fair). Set it on a shared endpoint: it bounds "
             "what one address may hold at all, held requests included.")] = None,
    client_share: Annotated[int | None, typer.Option(
        help="Per-client fairness: a client address's requests beyond this many are held unread (not refused; "
             "they count against --max-concurrent-requests) until one of its own ends, while other addresses' go "
             "ahead. Default: twice --max-batch, which keeps a lone client's (or a proxy's) every slot busy and one "
             "request ready per slot; 0: off.",
        show_default=False)] = None,
    max_input_tokens: Annotated[int | None, typer.Option(help="Longest prompt in tokens; longer is refused. "
                                                              "Default: the engine's max_input_len, at most "
                                                              "--max-total-tokens - 1.")] = None,
    max_total_tokens: Annotated[int | None, typer.Option(help="Prompt + new tokens per request; more is refused. "
                                                              "Default: the engine's max_seq_len.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="TRTBUILD_API_KEY", show_envvar=True,
                                                help="Require `Authorization: Bearer KEY` (401 otherwise); "
                                                     "/health and /metrics stay open.")] = None,
    model_name: Annotated[str | None, typer.Option(help="The model's name in the OpenAI API (`model`, "
                                                        "/v1/models). Default: the engine dir's name.")] = None,
    backend: Annotated[str, typer.Option(help=BACKEND_HELP)] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads: onnxruntime's intra-op threads "
                                                     "(default: the physical cores), or the torch backend's BLAS "
                                                     "threads on a CPU (default: OpenBLAS's).")] = None,
    prefix_cache: Annotated[bool, typer.Option(help="Reuse the KV of earlier prompts' and answers' full 16-token "
                                                    "blocks for requests that start the same way (a shared "
                                                    "system prompt is prefilled once, a chat's next turn "
                                                    "prefills only the new turn); onnxruntime backend.")] = True,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="Prompt tokens prefilled per step while other "
                                                                    "requests decode (chunked prefill): lower keeps "
                                                                    "their inter-token gaps short. Default: "
                                                                    "auto, what costs about one decode step.")]
    = None,
    kv_budget_tokens: Annotated[int | None, typer.Option(help="KV cache tokens all running requests may hold "
                                                              "together (each holds its context so far, in 16-token "
                                                              "blocks, growing as it decodes; the least urgent is "
                                                              "preempted when they run out); default: max_batch x "
                                                              "max_seq_len; on a paged engine it caps the block "
                                                              "pool.")] = None,
    kv_cache_memory: KVCacheMemory = None,
    gpu_memory_utilization: GpuMemoryUtilization = None,
    shutdown_timeout: Annotated[float, typer.Option(help="On SIGINT/SIGTERM, seconds in-flight requests get to "
                                                         "finish before they are cancelled.")]
    = DEFAULT_SHUTDOWN_TIMEOUT_S,
    max_request_bytes: Annotated[int, typer.Option(help="Largest request body in bytes; larger gets 413 before it "
                                                        "is read.")] = DEFAULT_MAX_REQUEST_BYTES,
    request_timeout: Annotated[float, typer.Option(help="Seconds a request may take from admission; then it is "
                                                        "cancelled: 504, or a timeout event ending its stream.")]
    = DEFAULT_REQUEST_TIMEOUT_S,
    max_top_logprobs: Annotated[int, typer.Option(help="Most alternatives per token (TGI top_n_tokens, OpenAI "
                                                       "top_logprobs / logprobs); more is refused.")]
    = DEFAULT_MAX_TOP_LOGPROBS,
    max_stop_sequences: Annotated[int, typer.Option(help="Most stop sequences per request; more is refused.")]
    = DEFAULT_MAX_STOP_SEQUENCES,
    max_stop_sequence_chars: Annotated[int, typer.Option(help="Longest stop sequence in characters; longer is "
                                                              "refused.")] = DEFAULT_MAX_STOP_SEQUENCE_CHARS,
    parse_chat_special_tokens: Annotated[bool, typer.Option(
        "--parse-chat-special-tokens",
        help="Read special tokens' text inside chat messages and tools (e.g. <|im_end|>) as control tokens. "
             "Default: off, it stays text, so no client can forge a turn or a system message; only the chat "
             "template places control tokens. Raw prompts (/v1/completions, /generate) always parse them: a "
             "client that sends a raw prompt writes the template's markers itself.")] = False,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection has to send a request's headers, from "
                                                       "its opening or its previous response's end; then it is "
                                                       "closed (idle and slow-header connections).")]
    = DEFAULT_HEADER_TIMEOUT_S,
    stalled_stream_timeout: Annotated[float, typer.Option(
        help="Seconds a response may wait on a client that reads nothing (its socket full); then the request "
             "is cancelled, its slot freed and the connection closed.")] = DEFAULT_STALLED_STREAM_TIMEOUT_S,
    max_connections: Annotated[int, typer.Option(help="Open connections beyond which a new request is answered 503 "
                                                      "at once.")] = DEFAULT_MAX_CONNECTIONS,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip checking the engine's files against the "
                                                                "sha256 its build recorded (trusted dirs only; "
                                                                "starts faster on large engines).")] = False,
    log_format: Annotated[str, typer.Option(help="Access log on stderr, one line per request (method, path, "
                                                 "status, tokens in/out, ms): text or json.")] = "text",
    speculative: Annotated[str | None, typer.Option(help="Speculative decoding for every request: ngram (prompt "
                                                         "lookup), draft (--draft-engine) or off; the same tokens at "
                                                         "temperature 0. Acceptance on /metrics. Default: the "
                                                         "engine's recipe runtime block, else off.")] = None,
    draft_engine: Annotated[Path | None, typer.Option(help="Engine dir drafting for --speculative draft (same "
                                                           "tokenizer, e.g. an int4 build of the model).")] = None,
    num_draft_tokens: Annotated[int | None, typer.Option(help="Draft tokens per verify step (default: adaptive "
                                                              "to the acceptance rate).")] = None,
    limit_mm_per_prompt: LimitMmPerPrompt = None,
    max_image_bytes: MaxImageBytes = None,
    max_image_pixels: MaxImagePixels = None,
    async_scheduling: AsyncScheduling = None,
) -> None:
    """Serve an engine over HTTP: TGI (/generate, /generate_stream) and OpenAI (/v1/completions,
    /v1/chat/completions, /v1/models) APIs, /health, Prometheus /metrics, API docs at /docs.

    Requests are batched in flight: each joins the running batch at the next step and leaves when
    it ends. Requests that leave out temperature follow the model's generation_config.json
    (greedy for most instruct checkpoints); TGI requests follow TGI (greedy unless do_sample).
    A request over a limit below is refused: 400 on the OpenAI routes, 422 on TGI's.

    \b
    Example:
      trtbuild serve engine --port 8000
      curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}]}'
    """
    from engine_builder.runner.parallel import launch
    from engine_builder.runner.vision.image_limits import image_limits_from_flags

    images = image_limits_from_flags(limit_mm_per_prompt, max_image_bytes, max_image_pixels)  # before any rank starts
    code = launch.dispatch_ranks(engine_dir, verify=not no_verify)  # tp/pp: a process per rank, rank 0 serves
    if code is not None:
        raise typer.Exit(code)
    from engine_builder.runner.speculative.speculative_config import from_flags
    from engine_builder.server.http_server import serve as serve_engine

    spec = from_flags(speculative, draft_engine, num_draft_tokens, engine_dir)  # checked before the engine loads
    memory = kv_cache_bytes(kv_cache_memory)
    serve_engine(engine_dir, host=host, port=port, max_batch=max_batch,
                 max_concurrent_requests=max_concurrent_requests, max_input_tokens=max_input_tokens,
                 max_total_tokens=max_total_tokens, api_key=api_key, model_name=model_name, backend=backend,
                 threads=threads, prefix_cache=prefix_cache, shutdown_timeout=shutdown_timeout,
                 max_num_batched_tokens=max_num_batched_tokens, kv_budget_tokens=kv_budget_tokens,
                 kv_cache_memory=memory, gpu_memory_utilization=gpu_memory_utilization,
                 max_request_bytes=max_request_bytes,
                 request_timeout=request_timeout, max_top_logprobs=max_top_logprobs,
                 max_stop_sequences=max_stop_sequences, max_stop_sequence_chars=max_stop_sequence_chars,
                 max_concurrent_per_client=max_concurrent_per_client, client_share=client_share,
                 parse_chat_special_tokens=parse_chat_special_tokens, header_timeout=header_timeout,
                 max_connections=max_connections, stalled_stream_timeout=stalled_stream_timeout,
                 on_ready=lambda url: print(f"serving at {url}", flush=True),
                 log=lambda line: print(line, file=sys.stderr, flush=True), log_format=log_format,
                 verify=not no_verify, speculative=spec, image_limits=images, async_scheduling=async_scheduling)
    # shut down cleanly: a process manager's second SIGTERM while the interpreter tears down (onnxruntime's
    # threads take a moment) must not turn exit 0 into death by signal
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.SIG_IGN)
