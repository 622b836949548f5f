"""`trtbuild serve-triton`: an engine behind Triton Inference Server (the binaries of the nvidia-pytriton wheel),
a thin layer over engine_builder.triton_serving.pytriton_binding.serve_triton (same keywords).

stdout gets one line once Triton answers: `triton serving MODEL http://HOST:PORT grpc HOST:PORT`; Triton's
own log goes to stderr. SIGINT/SIGTERM stop it; exit 0. Bad input (engine dir, missing extra) is exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def serve_triton(
    engine_dir: Annotated[Path, typer.Argument(help="Engine dir from `trtbuild build`.")],
    model_name: Annotated[str | None, typer.Option(help="The model's name in Triton. Default: the engine dir's "
                                                        "name.")] = None,
    host: Annotated[str, typer.Option(help="Interface for HTTP, gRPC and metrics.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port (KServe v2: /v2/models/NAME/generate, "
                                                "/generate_stream, /infer on NAME_sync).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port (streaming inference).")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = 8002,
    backend: Annotated[str, typer.Option(help="auto, tensorrt or onnxruntime.")] = "auto",
    threads: Annotated[int | None, typer.Option(help="onnxruntime intra-op threads.")] = None,
) -> None:
    """Serve an engine with Triton Inference Server as a decoupled streaming model (inputs text_input,
    max_tokens, optional temperature, random_seed, stream; outputs text_output, output_ids), and as NAME_sync,
    one response per request, for HTTP /infer.

    \b
    Example:
      trtbuild serve-triton engine --http-port 8000 --grpc-port 8001
      curl -s localhost:8000/v2/models/engine/generate -d '{"text_input": "Hello", "max_tokens": 16}'
    """
    from engine_builder.triton_serving.pytriton_binding import serve_triton as serve

    stdout = sys.stdout  # serve() sends everything else printed meanwhile (Triton's log) to stderr
    serve(engine_dir, model_name=model_name, host=host, http_port=http_port, grpc_port=grpc_port,
          metrics_port=metrics_port, backend=backend, threads=threads,
          on_ready=lambda e: print(f"triton serving {e.model_name} {e.http} grpc {e.grpc}", file=stdout, flush=True))
