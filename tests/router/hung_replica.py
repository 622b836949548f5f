"""A replica that is hung the way issue 36 found one: GET /health answers 200, every other request is read and
never answered. No `trtbuild serve` can be made to do that on purpose, so it is a real HTTP server of its own
(http.server, in a thread) that the real router process talks to over a real socket."""

from __future__ import annotations

import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HungReplica:
    def __init__(self) -> None:
        released = self.released = threading.Event()
        self.requests = 0
        self.closed = 0  # requests whose connection the other side closed while it hung
        hung = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path == "/health":
                    body = b'{"status": "ok"}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._hang()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._hang()

            def _hang(self) -> None:
                hung.requests += 1
                self.close_connection = True
                while not released.is_set():  # never an answer; until the test ends or the caller hangs up
                    if select.select([self.connection], [], [], 0.05)[0]:
                        if self.connection.recv(1, socket.MSG_PEEK) == b"":
                            hung.closed += 1
                            return

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
