"""A real `trtbuild serve` process on 127.0.0.1 for the server tests, and what they read from it."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from cli_process import ready_line
from prometheus_client.parser import text_string_to_metric_families

# Bounds for a shared 2-core CI machine: loading the model takes ~10 s there, up to ~60 s under load.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0
IDLE_TIMEOUT_S = 60.0


class LiveServer:
    """`python -m engine_builder.cli serve ENGINE --port 0 ARGS`: the URL comes from its ready line."""

    def __init__(self, engine: Path, *args: str) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty server never blocks
        self.proc = subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "serve", str(engine),
                                      "--port", "0", *args], stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.url = ready_line(self.proc, "serving at ", START_TIMEOUT_S, self.log)[0].split()[-1]

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def stop(self) -> int:
        """SIGTERM, as a process manager stops it; the exit code (0 = graceful)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"trtbuild serve ignored SIGTERM for {STOP_TIMEOUT_S} s: {self.log()}") from None


@contextlib.contextmanager
def live_server(engine: Path, *args: str) -> Iterator[LiveServer]:
    """A started server; stopped at the end, which must be clean (exit 0)."""
    server = LiveServer(engine, *args)
    try:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        yield server
    finally:
        code = server.stop()
        log = server.log()
        server.stderr.close()
    assert code == 0, f"trtbuild serve exited {code}: {log}"


def metrics(url: str) -> dict[str, float]:
    """GET /metrics as {sample name (+ {labels}): value}."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_idle(url: str) -> dict[str, float]:
    """Poll /metrics until no request is active and every KV slot is free; those metrics."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        m = metrics(url)
        if (m["trtbuild_running_requests"] == 0 and m["trtbuild_queue_depth"] == 0
                and m["trtbuild_active_requests"] == 0 and m["trtbuild_kv_slots_free"] == m["trtbuild_kv_slots"]):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not become idle within {IDLE_TIMEOUT_S} s: {m}")
        time.sleep(0.2)


def sse_data(lines: Iterator[str]) -> Iterator[dict | str]:
    """The payloads of an SSE stream's `data:` lines (JSON objects, or the string "[DONE]")."""
    for line in lines:
        if line.startswith("data:"):
            payload = line[len("data:"):].strip()
            yield payload if payload == "[DONE]" else json.loads(payload)
