"""`trtbuild serve-triton`: an engine bound to Triton Inference Server through nvidia-pytriton.

pytriton starts the real tritonserver of its wheel (HTTP, gRPC, metrics) and forwards each request of the
decoupled model to `infer` in this process, where the executor batches requests in flight; `infer` yields one
response per token (stream=true) or one with the whole text. One model instance per executor slot, so that
many requests are in flight at once. Triton runs on the CPU here (no GPU: its CUDA warnings are expected).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine_builder.executor.executor import Executor
from engine_builder.runner.llm import LLM
from engine_builder.triton_serving import stub_env
from engine_builder.triton_serving.handshake_retry import with_retry
from engine_builder.triton_serving.triton_io import (
    EXECUTION_ENV_PARAMETER,
    INPUTS,
    OUTPUTS,
    TritonTensor,
    check_model_name,
)
from engine_builder.triton_serving.triton_requests import generate_responses, parse_request
from engine_builder.util.errors import CapacityError, InputError, TrtbuildError

_NUMPY_TYPES = {"BYTES": bytes, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}


@dataclass(frozen=True)
class TritonEndpoints:
    http: str  # http://host:port (tritonclient.http takes "host:port")
    grpc: str  # host:port
    metrics: str
    model_name: str  # decoupled: gRPC streaming, HTTP /generate and /generate_stream
    sync_model_name: str  # the same engine, one response per request: what HTTP /infer accepts


def sync_name(model_name: str) -> str:
    """Triton's HTTP /infer refuses decoupled models ("HTTP end point doesn't support models with decoupled
    transaction policy", 501), so the engine is also bound under this name without the decoupled policy."""
    return f"{model_name}_sync"


def _tensor(spec: TritonTensor):
    from pytriton.model_config import Tensor

    return Tensor(name=spec.name, dtype=_NUMPY_TYPES[spec.data_type], shape=spec.dims, optional=spec.optional)


@contextlib.contextmanager
def _stub_runs_in(env: Path) -> Iterator[None]:
    """pytriton 0.7.0 writes each model's config.pbtxt itself and offers no backend parameter of its own, so its
    config class is wrapped for the duration to add EXECUTION_ENV_PATH (the stub's numpy 1.x env, stub_env.py);
    and the proxy files it sends with each model get the handshake retry (handshake_retry.py)."""
    import pytriton.models.model as pytriton_model

    config_class = pytriton_model.TritonModelConfig
    proxy_files = pytriton_model.Model.get_proxy_model_files

    def with_env(**kwargs):
        kwargs["backend_parameters"] = {**kwargs.get("backend_parameters", {}), EXECUTION_ENV_PARAMETER: str(env)}
        return config_class(**kwargs)

    pytriton_model.TritonModelConfig = with_env
    pytriton_model.Model.get_proxy_model_files = lambda model: with_retry(proxy_files(model))
    try:
        yield
    finally:
        pytriton_model.TritonModelConfig = config_class
        pytriton_model.Model.get_proxy_model_files = proxy_files


def make_infer(executor: Executor, encode: Callable[[str], list[int]]):
    """pytriton's decoupled callable: a generator of per-step response lists (one request per call: no Triton
    batching, the executor batches)."""
    from pytriton.exceptions import PyTritonBadParameterError

    def infer(requests):
        for request in requests:
            try:
                parsed = parse_request(dict(request.items()))
                for outputs in generate_responses(executor, encode, parsed):
                    yield [outputs]
            except (InputError, CapacityError) as exc:  # the client's request: Triton answers 400
                raise PyTritonBadParameterError(str(exc)) from None

    return infer


def make_sync_infer(executor: Executor, encode: Callable[[str], list[int]]):
    """pytriton's callable for the non-decoupled twin: the whole text in one response (stream is ignored)."""
    from pytriton.exceptions import PyTritonBadParameterError

    def infer(requests):
        results = []
        for request in requests:
            try:
                parsed = dataclasses.replace(parse_request(dict(request.items())), stream=False)
                results.extend(generate_responses(executor, encode, parsed))
            except (InputError, CapacityError) as exc:
                raise PyTritonBadParameterError(str(exc)) from None
        return results

    return infer


def _check_free(host: str, port: int, flag: str) -> None:
    """Refuse a taken port before the engine loads: tritonserver would only time out on it, with a traceback."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is not taken
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InputError(f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror}); choose a free port "
                             "or stop what holds it") from None


@contextlib.contextmanager
def triton_server(engine_dir: Path, *, model_name: str | None = None, host: str = "127.0.0.1",
                  http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002, backend: str = "auto",
                  threads: int | None = None, python_env: Path | None = None,
                  log_verbose: int = 0) -> Iterator[TritonEndpoints]:
    """Triton serving ENGINE_DIR as the decoupled model MODEL_NAME (default: the dir's name) until the block
    ends. Ports must be free (Triton cannot pick one)."""
    try:
        from pytriton.model_config import ModelConfig
        from pytriton.triton import Triton, TritonConfig
    except ImportError:
        raise InputError("nvidia-pytriton is not installed; `make install` installs it (pip install --no-deps "
                         "nvidia-pytriton==0.7.0 plus the `triton` extra: pip install 'trtbuild[triton]')") from None
    for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
        if not 1 <= port <= 65535:
            raise InputError(f"{flag} {port} is not a TCP port; give one in 1..65535 (Triton cannot pick a free one)")
    if len({http_port, grpc_port, metrics_port}) < 3:
        raise InputError(f"--http-port, --grpc-port and --metrics-port must differ (got {http_port}, {grpc_port}, "
                         f"{metrics_port})")
    for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
        _check_free(host, port, flag)
    env = stub_env.require(python_env)
    engine_dir = Path(engine_dir)
    name = check_model_name(model_name or engine_dir.resolve().name)
    llm = LLM(engine_dir, backend=backend, threads=threads)
    os.environ.update(stub_env.server_environment())  # inherited by tritonserver and its stubs
    config = TritonConfig(http_address=host, http_port=http_port, grpc_address=host, grpc_port=grpc_port,
                          metrics_address=host, metrics_port=metrics_port, log_verbose=log_verbose,
                          exit_timeout_secs=5)
    with Executor(llm) as executor, _stub_runs_in(env):
        instances = max(1, executor.stats().max_batch)
        infer = make_infer(executor, llm.encode)
        triton = Triton(config=config)
        try:
            for bound, callable_, decoupled in ((name, infer, True),
                                                (sync_name(name), make_sync_infer(executor, llm.encode), False)):
                triton.bind(model_name=bound, infer_func=[callable_] * instances,
                            inputs=[_tensor(t) for t in INPUTS], outputs=[_tensor(t) for t in OUTPUTS],
                            config=ModelConfig(batching=False, decoupled=decoupled), strict=True)
            triton.run()
        except Exception as exc:  # a taken port, a stub that cannot start: pytriton's own words, on one line
            triton.stop()
            raise TrtbuildError(f"Triton did not start: {exc}; check that ports {http_port}, {grpc_port}, "
                                f"{metrics_port} are free") from None
        try:
            yield TritonEndpoints(f"http://{host}:{http_port}", f"{host}:{grpc_port}",
                                  f"http://{host}:{metrics_port}/metrics", name, sync_name(name))
        finally:
            triton.stop()


@contextlib.contextmanager
def repository_server(repo: Path, *, host: str = "127.0.0.1", http_port: int = 8000, grpc_port: int = 8001,
                      metrics_port: int = 8002) -> Iterator[str]:
    """The wheel's tritonserver over a model repository (`trtbuild export-triton`'s), loading every model in it,
    until the block ends; yields the HTTP URL. Each model's python backend runs in the environment its config
    names (export with --python-env for the numpy 1.x env of stub_env.py)."""
    from pytriton.triton import Triton, TritonConfig

    os.environ.update(stub_env.server_environment())
    triton = Triton(config=TritonConfig(model_repository=Path(repo).absolute(), http_address=host,
                                        http_port=http_port, grpc_address=host, grpc_port=grpc_port,
                                        metrics_address=host, metrics_port=metrics_port, exit_timeout_secs=5))
    try:
        triton.run()
        yield f"http://{host}:{http_port}"
    finally:
        triton.stop()


def serve_triton(engine_dir: Path, *, on_ready: Callable[[TritonEndpoints], None] = lambda e: None,
                 **options) -> None:
    """triton_server(...) until SIGINT or SIGTERM. Triton's own log goes to stderr: pytriton prints it on stdout,
    which is kept for the caller's ready line (on_ready should print to the stdout it held before the call)."""
    stop = threading.Event()
    with contextlib.redirect_stdout(sys.stderr), triton_server(engine_dir, **options) as endpoints:
        previous = {signum: signal.signal(signum, lambda *_: stop.set()) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            on_ready(endpoints)
            stop.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
