"""`trtbuild serve` replicas on fixed ports (so a SIGKILLed one restarts where the router looks for it) and
`trtbuild route`, as real processes; used by tests/router and benchmarks/router.py."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from live_server import START_TIMEOUT_S, LiveServer, metrics  # noqa: E402

# every test's requests fit: the kill test queues ~50 at once over two replicas
REPLICA_ARGS = ("--max-concurrent-requests", "256", "--model-name", "tiny")
HEALTH_INTERVAL_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """A `trtbuild serve` of the engine on a port of its own, that a test may SIGKILL and start again."""

    def __init__(self, engine: Path, *flags: str) -> None:
        self.engine, self.flags, self.port = engine, flags, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = self._start()

    def _start(self) -> LiveServer:
        server = LiveServer(self.engine, *REPLICA_ARGS, *self.flags, "--port", str(self.port))  # the last --port wins
        assert server.url == self.url, (server.url, self.url)
        return server

    def kill(self) -> None:
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()

    def restart(self) -> None:
        self.server.stderr.close()
        self.server = self._start()

    def stop(self) -> None:
        if self.server.proc.poll() is None:
            self.server.proc.kill()
            self.server.proc.wait()
        self.server.stderr.close()


class Router:
    """`python -m engine_builder.cli route --backend A --backend B ... --port 0`: its URL from its ready line."""

    def __init__(self, backends: list[str], policy: str, health_interval: float = HEALTH_INTERVAL_S,
                 *flags: str) -> None:
        args = [a for url in backends for a in ("--backend", url)]
        self.log_file = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "engine_builder.cli", "route", *args, "--policy", policy,
                                      "--port", "0", "--health-interval", str(health_interval), *flags],
                                     stdout=subprocess.PIPE, stderr=self.log_file, text=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                line = self.proc.stdout.readline()
                if line.startswith("routing at "):
                    self.url = line.split()[-1]
                    return
                if not line:
                    break
        self.proc.kill()
        raise AssertionError(f"trtbuild route did not start (exit {self.proc.wait()}): {self.log()}")

    def log(self) -> str:
        self.log_file.seek(0)
        return self.log_file.read()

    def metrics(self) -> dict[str, float]:
        return metrics(self.url)

    def backend_metric(self, name: str, backend: str) -> float:
        return self.metrics()[f'trtbuild_router_backend_{name}{{backend="{backend}"}}']

    def wait_healthy(self, backend: str, healthy: bool = True, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.backend_metric("healthy", backend) != (1.0 if healthy else 0.0):
            assert time.monotonic() < deadline, f"{backend} not {'healthy' if healthy else 'out'}: {self.log()}"
            time.sleep(0.1)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log_file.close()
