"""What the router passes on and what it keeps to itself, against a real HTTP backend (a Starlette app on
uvicorn, in a thread) that echoes what reached it: no cookie jar shared between users, the client's own
headers forwarded, its own GET /health and /metrics, other methods on those paths forwarded, 405 for the rest."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn
from route_processes import Router
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def echo(request: Request) -> JSONResponse:
    response = JSONResponse({"method": request.method, "path": request.url.path,
                             "cookie": request.headers.get("cookie"), "user_agent": request.headers.get("user-agent"),
                             "body": (await request.body()).decode()})
    response.set_cookie("session", "alice")  # a replica's cookie must reach this client only
    return response


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


@pytest.fixture(scope="module")
def backend():
    app = Starlette(routes=[Route("/health", health, methods=["GET"]),
                            Route("/{path:path}", echo, methods=["GET", "POST", "PUT", "DELETE"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def router(backend):
    r = Router([backend], "round-robin")
    r.wait_healthy(backend)
    yield r
    assert r.stop() == 0


def test_cookies_and_headers_pass_through_without_a_shared_jar(router):
    first = httpx.post(f"{router.url}/v1/echo?x=1", content=b"hello", headers={"user-agent": "tester/1"})
    assert first.status_code == 200
    assert first.json() == {"method": "POST", "path": "/v1/echo", "cookie": None, "user_agent": "tester/1",
                            "body": "hello"}
    assert first.cookies.get("session") == "alice"  # the Set-Cookie reached its client
    second = httpx.get(f"{router.url}/v1/echo")  # another user: no cookie of the first one's
    assert second.json()["cookie"] is None
    mine = httpx.get(f"{router.url}/v1/echo", cookies={"session": "bob"})
    assert mine.json()["cookie"] == "session=bob"


def test_own_routes_and_refused_methods(router, backend):
    assert httpx.get(f"{router.url}/health").json()["backends"] == {backend: "healthy"}
    assert "trtbuild_router_backend_requests_total" in httpx.get(f"{router.url}/metrics").text
    forwarded = httpx.post(f"{router.url}/health", content=b"x")  # only GET/HEAD /health is the router's
    assert forwarded.json()["path"] == "/health" and forwarded.json()["method"] == "POST"
    assert httpx.request("TRACE", f"{router.url}/v1/echo").status_code == 405
