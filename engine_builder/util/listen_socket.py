"""The listening socket and signal handling that `serve` and `route` share: both bind before any slow
start-up work (a taken port is a one-line error at once) and run uvicorn on that socket."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator

from engine_builder.util.errors import InputError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a taken port is a one-line error before the model loads,
    and port 0 picks a free one (the ready line then names it)."""
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InputError(f"cannot resolve --host {host!r} ({exc.strerror}); give an IP address such as "
                         "127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart at once after a stop (TIME_WAIT)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port "
                         "(0 = any free port) or stop what uses it") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def signals_ignored_after_uvicorn() -> Iterator[None]:
    """uvicorn installs its own handlers while it serves and, once done, re-raises the caught signal
    under the handlers it found; SIG_IGN there turns that into a no-op, so a clean shutdown exits 0."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
