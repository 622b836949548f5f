"""serve(): open an engine dir, start its Executor, and run the HTTP app on uvicorn until SIGINT/SIGTERM.

Start-up checks everything a user can get wrong (port taken, limits above the engine's, a bad
--max-batch) before the model loads where it can, so a typo fails in milliseconds.

Shutdown, on SIGINT or SIGTERM (uvicorn's own sequence, then ours):
  1. stop accepting connections; idle keep-alive connections are closed
  2. in-flight requests run to their end, for at most shutdown_timeout seconds; then each is
     cancelled (ServerState.cancel_all), which frees its KV slot and ends it the way a failed request
     ends: 503, or its stream's terminal event ([DONE] on OpenAI routes); uvicorn cancels whatever
     task is still left SHUTDOWN_GRACE_S later
  3. executor.shutdown (nothing is left to drain by then), the backend is closed, return
uvicorn re-raises the signal it caught once it is done, so the process would die by it (exit 130
or -15) after a clean shutdown; both signals are ignored while serve() runs instead, and the
caller exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine_builder.runner.vision.image_limits import ImageLimits
from engine_builder.server.config import (
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_STOP_SEQUENCE_CHARS,
    DEFAULT_MAX_STOP_SEQUENCES,
    DEFAULT_MAX_TOP_LOGPROBS,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_STALLED_STREAM_TIMEOUT_S,
    ServerConfig,
)
from engine_builder.server.connection_limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS, bounded_protocol
from engine_builder.util.errors import InputError
from engine_builder.util.listen_socket import bind, signals_ignored_after_uvicorn, url_of

if TYPE_CHECKING:
    from engine_builder.runner.speculative import SpeculativeConfig
    from engine_builder.server.client_share import ClientShare
    from engine_builder.server.generation import ServerState

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# After the shutdown timeout cancels the requests, the time their responses get to send their last
# event before uvicorn cancels the tasks outright
SHUTDOWN_GRACE_S = 5.0


def serve(engine_dir: str | Path, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int | None = None,
          max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS, max_input_tokens: int | None = None,
          max_total_tokens: int | None = None, api_key: str | None = None, model_name: str | None = None,
          backend: str = "auto", threads: int | None = None, prefix_cache: bool = True,
          max_num_batched_tokens: int | None = None, kv_budget_tokens: int | None = None,
          kv_cache_memory: int | None = None, gpu_memory_utilization: float | None = None,
          shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
          max_top_logprobs: int = DEFAULT_MAX_TOP_LOGPROBS, max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES,
          max_stop_sequence_chars: int = DEFAULT_MAX_STOP_SEQUENCE_CHARS, max_concurrent_per_client: int | None = None,
          parse_chat_special_tokens: bool = False, header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
          max_connections: int = DEFAULT_MAX_CONNECTIONS,
          stalled_stream_timeout: float = DEFAULT_STALLED_STREAM_TIMEOUT_S, client_share: int | None = None,
          on_ready: Callable[[str], None] = print, log: Callable[[str], None] | None = None,
          log_format: str | None = None, verify: bool = True, speculative: SpeculativeConfig | None = None,
          image_limits: ImageLimits = ImageLimits(), async_scheduling: bool | None = None) -> None:
    """Serve an engine dir over HTTP until SIGINT/SIGTERM. on_ready(url) runs once it accepts
    connections; log(line) gets the start-up summary (backend, limits) and, with log_format "text" or
    "json", an access-log line per request (server/access_log.py). speculative: every request of this
    server decodes speculatively (runner/speculative/; same tokens at temperature 0), its acceptance
    counted on /metrics (server/speculative_metrics.py). image_limits: what a request's images may be (a
    vision-language engine; runner/vision/image_limits.py). async_scheduling: the torch backend's decode steps
    launched ahead of the last one's tokens (runner/async_decode.py; None: on a GPU, as LLM decides)."""
    from engine_builder.executor import Executor
    from engine_builder.executor.scheduler_options import budget_total_tokens, scheduler_config
    from engine_builder.runner.backend_choice import BACKENDS
    from engine_builder.runner.engine import EngineDir
    from engine_builder.server.access_log import LOG_FORMATS

    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if log_format is not None and log_format not in LOG_FORMATS:
        raise InputError(f"--log-format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if not (math.isfinite(header_timeout) and header_timeout > 0):
        raise InputError(f"--header-timeout must be a number of seconds > 0, got {header_timeout}")
    if max_connections < 1:
        raise InputError(f"--max-connections must be >= 1, got {max_connections}")
    bounds = (header_timeout, max_connections)
    if shutdown_timeout < 0:
        raise InputError(f"--shutdown-timeout must be >= 0 seconds, got {shutdown_timeout}")
    engine = EngineDir.load(engine_dir, verify=False)  # the limits only: LLM() below checks the files, once
    name = model_name if model_name is not None else Path(engine_dir).resolve().name
    limits = engine.limits
    if engine.model.encoder is not None:  # no generated tokens: ServerConfig's "total" room is the input's own
        limits = dataclasses.replace(limits, max_seq_len=limits.max_input_len + 1)
    if kv_budget_tokens is not None and max_total_tokens is None:  # a request the budget can't hold: 422 up front
        max_total_tokens = budget_total_tokens(limits, kv_budget_tokens, max_input_tokens)
    config = ServerConfig.for_engine(limits, name, max_input_tokens=max_input_tokens,
                                     max_total_tokens=max_total_tokens,
                                     max_concurrent_requests=max_concurrent_requests, api_key=api_key,
                                     max_request_bytes=max_request_bytes, request_timeout=request_timeout,
                                     max_top_logprobs=max_top_logprobs, max_stop_sequences=max_stop_sequences,
                                     max_stop_sequence_chars=max_stop_sequence_chars,
                                     max_concurrent_per_client=max_concurrent_per_client,
                                     parse_chat_special_tokens=parse_chat_special_tokens,
                                     stalled_stream_timeout=stalled_stream_timeout, client_share=client_share,
                                     image_limits=image_limits)
    # queued + running never exceeds max_concurrent_requests, so the executor's queue must hold them all
    scheduler = scheduler_config(max_batch, max_concurrent_requests, max_num_batched_tokens, kv_budget_tokens)
    batch = scheduler.batch_for(engine.limits.max_batch)  # a bad --max-batch fails before the model loads
    sock = bind(host, port)
    if engine.model.encoder is not None:  # an embedding model: server/embedding_app.py
        from engine_builder.server.embedding_app import embedding_app

        with contextlib.closing(sock), embedding_app(engine_dir, config, backend=backend, threads=threads,
                                                     log=log, verify=verify) as app, signals_ignored_after_uvicorn():
            asyncio.run(_run_uvicorn(app, sock, shutdown_timeout, on_ready, bounds))
        return

    from engine_builder.runner.llm import LLM
    from engine_builder.server.asgi_app import create_app

    with contextlib.closing(sock), LLM(engine_dir, backend=backend, threads=threads, prefix_cache=prefix_cache,
                                       verify=verify, speculative=speculative, kv_cache_memory=kv_cache_memory,
                                       gpu_memory_utilization=gpu_memory_utilization,
                                       async_scheduling=async_scheduling) as llm:
        warm = llm.warm_up(log)  # before the first request: torch.compile and the CUDA graphs on a GPU
        if warm is not None and log is not None:
            log(f"warm in {warm.seconds:.1f} s (torch.compile {warm.compile_seconds:.1f} s, {warm.graphs} CUDA "
                f"graphs {warm.capture_seconds:.1f} s)")
        executor = Executor(llm, scheduler)
        try:
            app = create_app(executor, config, access_log=log if log_format else None,
                             log_format=log_format or "text")  # type: ignore[arg-type]
            if log is not None:
                log(f"{name}: {llm.backend_name} ({llm.backend_reason}); max batch {batch}, max input tokens "
                    f"{config.max_input_tokens}, max total tokens {config.max_total_tokens}, max concurrent "
                    f"requests {config.max_concurrent_requests}"
                    f"{_per_client(config.max_concurrent_per_client)}, client share "
                    f"{_share(app.state.server.client_share)}, max request bytes {config.max_request_bytes}, "
                    f"request timeout {config.request_timeout:g} s{', API key required' if api_key else ''}"
                    f"{_speculative_summary(speculative)}")
            with signals_ignored_after_uvicorn():
                asyncio.run(_run_uvicorn(app, sock, shutdown_timeout, on_ready, bounds))
        finally:
            executor.shutdown(drain=False)


def _share(door: ClientShare | None) -> str:
    return "off" if door is None else str(door.share)


def _per_client(limit: int | None) -> str:
    return "" if limit is None else f" ({limit} per client)"


def _speculative_summary(config: SpeculativeConfig | None) -> str:
    if config is None:
        return ""
    k = f"{config.num_draft_tokens} draft tokens" if config.num_draft_tokens else "adaptive draft length"
    drafter = f" ({config.draft_engine})" if config.draft_engine else ""
    return f", speculative {config.method}{drafter} with {k}"


async def _run_uvicorn(app: object, sock: socket.socket, shutdown_timeout: float,
                       on_ready: Callable[[str], None],
                       bounds: tuple[float, int] = (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS)) -> None:
    import uvicorn

    # lifespan off: the executor's life is serve()'s; access log off: a line per token-stream
    # request costs more than it tells on a busy server (/metrics counts them)
    # connection bounds (connection_limits.py): late headers close the connection, too many get 503
    header_timeout, max_connections = bounds
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=shutdown_timeout + SHUTDOWN_GRACE_S,
                            http=bounded_protocol(header_timeout), limit_concurrency=max_connections)
    server = _uvicorn_server(config, app.state.server, shutdown_timeout)
    # what start-up made (tokenizers, the grammar engine's, the app, the engine's metadata) lives as long as the
    # server: frozen, a full collection no longer walks it (45 ms for SmolLM2's ~96k start-up objects, quiet 2-core
    # CPU), a pause of the event loop and of every stream. benchmarks/serve_grammar_load.py's /health max: 68-74 ms
    # without, 11.5-11.7 ms with (two runs each)
    gc.collect()
    gc.freeze()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        on_ready(url_of(sock))
        sys.stdout.flush()
    await task


def _uvicorn_server(config: object, state: ServerState, shutdown_timeout: float) -> object:
    """uvicorn.Server that cancels the requests still running shutdown_timeout seconds into a shutdown,
    so each ends with its terminal event instead of a cut connection (uvicorn cancels tasks outright)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            timer = asyncio.get_running_loop().call_later(shutdown_timeout, state.cancel_all)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return Server(config)
