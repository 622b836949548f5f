"""Per-client fairness, on by default (--client-share): a client address's generation requests beyond its share
wait, in arrival order, before their body is read, until one of that client's own requests ends; other
addresses' requests go ahead of them meanwhile. Nothing is refused for it.

Why a wait at the door and not a place in the executor's queue: the executor admits by priority, then first
come, first served, so 100 requests one client sent at once would run before a request another client sends a
moment later. With at most SHARE of a client's requests past this door (being tokenized, queued or running), a
later client's request is behind at most SHARE of them. The default share, twice the executor's batch, keeps
every KV slot of a lone client (or of a proxy that sends everything from one address) busy and one request ready
to take each slot that frees, so such a client loses no throughput; a flooding client holds at most the batch
running and the batch queued ahead of anyone else. --max-concurrent-per-client is the hard limit (429 above).

Held requests count against --max-concurrent-requests like admitted ones: past it a request is answered 429
at once rather than held. Only POSTs to the generation routes are counted (/tokenize, embeddings and GETs pass).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from engine_builder.server.http_errors import OVERLOADED, error_response

GENERATION_PATHS = frozenset({"/", "/generate", "/generate_stream", "/v1/completions", "/v1/chat/completions"})


class ClientShare:
    """The door's bookkeeping, one per app (ServerState.client_share; /metrics reads `held`). Event loop only."""

    def __init__(self, share: int) -> None:
        self.share = share  # a client's requests past the door at once
        self.passed: Counter[str] = Counter()  # address -> its requests past the door, not yet ended
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}  # address -> its held requests, oldest first
        self.held = 0  # all addresses' held requests

    def passes(self, client: str) -> bool:
        """Counts the request in and says yes when it may go on at once."""
        if self.passed[client] < self.share and client not in self.waiting:
            self.passed[client] += 1
            return True
        return False

    async def wait_turn(self, client: str) -> None:
        turn = asyncio.get_running_loop().create_future()
        queue = self.waiting.setdefault(client, deque())
        queue.append(turn)
        self.held += 1
        try:
            await turn  # leave() passes the ending request's place on: passed[client] stays as it was
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # the turn came as the wait was cancelled: pass it on
                self.leave(client)
            else:
                self.held -= 1
                if turn in queue:
                    queue.remove(turn)
                if not queue and self.waiting.get(client) is queue:
                    del self.waiting[client]
            raise

    def leave(self, client: str) -> None:
        queue = self.waiting.get(client)
        while queue:
            turn = queue.popleft()
            if not queue:
                del self.waiting[client]
            if not turn.done():  # a cancelled wait already left
                self.held -= 1
                turn.set_result(None)
                return
        self.passed[client] -= 1
        if not self.passed[client]:
            del self.passed[client]  # no entry per address ever seen: memory stays bounded


class ClientShareMiddleware:
    def __init__(self, app: ASGIApp, door: ClientShare, room: Callable[[], int],
                 on_reject: Callable[[int], None]) -> None:
        """room(): how many more requests the server may hold (--max-concurrent-requests less the admitted ones)."""
        self.app, self.door, self._room, self._on_reject = app, door, room, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        client, door = (scope.get("client") or ("-", 0))[0], self.door
        if not door.passes(client):
            if self._room() - door.held <= 0:
                self._on_reject(OVERLOADED.status)
                message = (f"the server is busy: {door.held} requests wait for their client's turn beside the "
                           "admitted ones (max_concurrent_requests, --max-concurrent-requests); retry later")
                await error_response(Request(scope), OVERLOADED, message)(scope, receive, send)
                return
            await door.wait_turn(client)
        try:
            await self.app(scope, receive, send)
        finally:
            door.leave(client)
