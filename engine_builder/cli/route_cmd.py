"""`trtbuild route`: the request router, a thin layer over engine_builder.router.route (same keywords).

Registered by cli/commands.py with user_errors: bad input (no --backend, a malformed URL, an unknown
policy, a taken port) is one line on stderr and exit 2. stdout gets one line, the URL, once the router
accepts connections; backend changes (taken out, put back) go to stderr. SIGINT/SIGTERM stop it; exit 0.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from engine_builder.router.router_config import DEFAULT_FIRST_BYTE_TIMEOUT_S, DEFAULT_HEALTH_INTERVAL_S, POLICIES


def route(
    backend: Annotated[list[str] | None, typer.Option("--backend", help="Base URL of a `trtbuild serve` replica; "
                                                      "repeat for each one.")] = None,
    policy: Annotated[str, typer.Option(help=f"How a replica is picked: {', '.join(POLICIES)} (requests sharing a "
                                             "prompt prefix go to the replica that likely has it cached).")]
    = "round-robin",
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one (printed).")] = 8000,
    health_interval: Annotated[float, typer.Option(help="Seconds between health checks of each replica (GET "
                                                        "/health); a failing one is taken out, put back when it "
                                                        "answers again.")] = DEFAULT_HEALTH_INTERVAL_S,
    first_byte_timeout: Annotated[float, typer.Option(
        help="Seconds to wait for a replica's first byte (a stream's first event; a non-streamed answer comes "
             "whole when it is complete, so set this above your longest non-streamed generation, or stream). "
             "Past it the replica is taken out as hung for 30 s and the request, which has sent its client "
             "nothing yet, goes to another replica.")] = DEFAULT_FIRST_BYTE_TIMEOUT_S,
) -> None:
    """Route TGI and OpenAI requests over several `trtbuild serve` replicas: streaming passed through,
    failover (a request whose replica fails before it streamed anything goes to another one),
    health-checked replicas, per-replica Prometheus /metrics.

    \b
    Example:
      trtbuild serve engine --port 8001 &
      trtbuild serve engine --port 8002 &
      trtbuild route --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 --policy prefix-aware
    """
    from engine_builder.router.router_server import route as run_router

    run_router(backend or [], policy=policy, host=host, port=port, health_interval=health_interval,
               first_byte_timeout=first_byte_timeout,
               on_ready=lambda url: print(f"routing at {url}", flush=True),
               log=lambda line: print(line, file=sys.stderr, flush=True))
