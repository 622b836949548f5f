"""A refusal sent before the request's body was read (413 over --max-request-bytes, 401, 429) reaches clients
that send the whole body before reading, as ASGI middleware around those refusals.

A client that sends `Connection: close` (Python's urllib does, on every request) makes uvicorn close the
socket as soon as the response ends. Closing a socket with unread bytes in its receive buffer makes the
kernel send a reset instead of a FIN, and a client still sending its body then sees "connection reset" or
"broken pipe", never the 413 that names the limit and how to raise it. So when a response ends while the
body has not been read to its end, this sends the response's bytes, then reads and drops the rest of the
body, then ends the response, which lets uvicorn close cleanly (or keep the connection alive). What is
dropped is bounded, as nginx's lingering close bounds it:

    DRAIN_BYTES       at most 64 MiB more are read (~200 MB/s here: ~0.3 s of one core, between other requests);
                      a client sending more gets the reset
    DRAIN_IDLE_S      5 s without a byte (a client that waits for the answer before sending, `Expect:
                      100-continue`, or stopped) ends the draining
    DRAIN_SECONDS     30 s in all
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_BYTES = 64 << 20
DRAIN_IDLE_S = 5.0
DRAIN_SECONDS = 30.0


class UnreadBodyMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        body_done = False

        async def tracking_receive() -> Message:
            nonlocal body_done
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True  # the whole body, or the client left
            return message

        async def draining_send(message: Message) -> None:
            if (body_done or message["type"] != "http.response.body" or message.get("more_body", False)):
                await send(message)
                return
            await send({**message, "more_body": True})  # the answer's bytes go out now
            await _drain(receive)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app(scope, tracking_receive, draining_send)


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"0", b"")):
            return True
    return False


async def _drain(receive: Receive) -> None:
    """Read and drop the rest of the request body, within the bounds above."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    drained = 0
    while drained <= DRAIN_BYTES:
        try:
            message = await asyncio.wait_for(receive(), min(DRAIN_IDLE_S, max(0.0, deadline - loop.time())))
        except TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        drained += len(message.get("body", b""))
