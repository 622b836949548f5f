"""`trtbuild serve-triton` as a real process, and the official tritonclient calls the Triton tests make."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cli_process import ready_line

START_TIMEOUT_S = 240.0  # model load + tritonserver + one python stub per model instance, on a loaded 2-core box


def free_ports(n: int) -> list[int]:
    """N ports free now (Triton cannot pick its own: it has no port 0)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class TritonProcess:
    """`python -m engine_builder.cli serve-triton ENGINE --http-port .. --grpc-port .. --metrics-port ..`."""

    def __init__(self, engine: Path, *args: str) -> None:
        http, grpc, metrics = free_ports(3)
        self.log_file = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_builder.cli", "serve-triton", str(engine), "--http-port", str(http),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics), *args],
            stdout=subprocess.PIPE, stderr=self.log_file, text=True)
        line, number = ready_line(self.proc, "triton serving ", START_TIMEOUT_S, self.log)
        _, _, self.model, self.http_url, _, self.grpc_url = line.split()
        self.first_stdout_line = number == 1

    def log(self) -> str:
        self.log_file.seek(0)
        return self.log_file.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def inputs(client_module, prompt: str, max_tokens: int, *, stream: bool | None = None,
           temperature: float | None = None, seed: int | None = None) -> list:
    """The request as tritonclient InferInputs (client_module: tritonclient.http or tritonclient.grpc)."""
    values = [("text_input", "BYTES", np.array([prompt.encode()], dtype=np.object_)),
              ("max_tokens", "INT32", np.array([max_tokens], dtype=np.int32))]
    if stream is not None:
        values.append(("stream", "BOOL", np.array([stream], dtype=np.bool_)))
    if temperature is not None:
        values.append(("temperature", "FP32", np.array([temperature], dtype=np.float32)))
    if seed is not None:
        values.append(("random_seed", "UINT64", np.array([seed], dtype=np.uint64)))
    made = []
    for name, datatype, array in values:
        tensor = client_module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        made.append(tensor)
    return made


@dataclass(frozen=True)
class Streamed:
    texts: list[str]  # one per response
    ids: list[list[int]]
    error: str | None = None


def grpc_stream(url: str, model: str, prompts: list[str], max_tokens: int, **options) -> list[Streamed]:
    """Send every prompt on one gRPC bidirectional stream at once (stream=true); collect each request's responses
    until its final flag (tritonclient's enable_empty_final_response)."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i, prompt in enumerate(prompts):
            client.async_stream_infer(model, inputs(grpcclient, prompt, max_tokens, stream=True, **options),
                                      request_id=str(i), enable_empty_final_response=True)
        collected = {str(i): ([], [], None) for i in range(len(prompts))}
        open_requests = set(collected)
        while open_requests:
            result, error = results.get(timeout=120)
            if error is not None:  # the stream's error names no request id: there is one request in flight
                (rid,) = open_requests
                collected[rid] = (*collected[rid][:2], str(error))
                open_requests.discard(rid)
                continue
            response = result.get_response()
            if response.outputs:
                collected[response.id][0].append(result.as_numpy("text_output")[0].decode())
                collected[response.id][1].append(result.as_numpy("output_ids").tolist())
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                open_requests.discard(response.id)
        return [Streamed(*collected[str(i)]) for i in range(len(prompts))]
    finally:
        client.stop_stream()
        client.close()


def http_infer(url: str, model: str, prompt: str, max_tokens: int, **options) -> tuple[str, list[int]]:
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    try:
        result = client.infer(model, inputs(httpclient, prompt, max_tokens, **options))
        return result.as_numpy("text_output")[0].decode(), result.as_numpy("output_ids").tolist()
    finally:
        client.close()
