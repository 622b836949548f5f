"""Per-client fairness, on by default (serve --client-share, server/client_share.py), on live servers of the tiny
engine (max_batch 2, so the default share is 4) with real httpx clients; loopback addresses 127.0.0.2+ stand for
other clients (Linux routes all of 127/8 to lo).

    a flood      one address sends 32 long requests at once; a second address's short request, sent while more
                 than twice the share of them wait, ends after at most 2 x share of them (the ones past the door
                 when it was sent or when it reached the executor): with --client-share 0 (the old default) it
                 waits behind the executor's whole queue of them
    one client   a lone client sending more than its share loses nothing: every request is answered 200 with the
                 lone request's answer, none refused, and the slots stay full while its extra requests wait
    the door     ClientShare's bookkeeping on a real event loop: order per client, cancelled waits
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from live_server import live_server, metrics, wait_idle

from engine_builder.server.client_share import ClientShare

SHARE = 4  # twice the tiny engine's max_batch 2
LONG = {"prompt": "w5 w6", "max_tokens": 80, "temperature": 0}  # greedy: runs to max_tokens on the tiny model
SHORT = {"prompt": "w7", "max_tokens": 1, "temperature": 0}
FLOOD = 32


def client(url: str, address: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=300, transport=httpx.HTTPTransport(local_address=address))


def _flood(url: str, n: int, log: list[str], lock: threading.Lock, answers: list[str]) -> list[threading.Thread]:
    """n LONG requests from 127.0.0.1, one thread each, sent together (each connection opened first); every end
    is appended to log as "A"."""
    together = threading.Barrier(n)

    def one() -> None:
        with client(url, "127.0.0.1") as c:
            assert c.get("/health").status_code == 200  # the connection is open: the POSTs arrive together
            together.wait(120)
            r = c.post("/v1/completions", json=LONG)
        with lock:
            log.append("A" if r.status_code == 200 else f"A {r.status_code}")
            answers.append(r.json()["choices"][0]["text"] if r.status_code == 200 else r.text)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def _wait_for(url: str, gauge: str, at_least: int) -> None:
    """Poll until the gauge reaches at_least (a hang guard of 120 s, not a time bound)."""
    deadline = threading.Event()
    timer = threading.Timer(120, deadline.set)
    timer.start()
    try:
        while metrics(url)[gauge] < at_least:
            assert not deadline.is_set(), f"{gauge} never reached {at_least}"
            time.sleep(0.02)
    finally:
        timer.cancel()


@pytest.mark.parametrize("share_args, backlog_gauge", [
    ((), "trtbuild_client_share_waiting"),  # the default: fairness on
    (("--client-share", "0"), "trtbuild_queue_depth"),  # off, as before issue 36: the executor's queue is FIFO
])
def test_a_flooding_client_does_not_queue_ahead_of_another(tiny_serve_engine, share_args, backlog_gauge):
    with live_server(tiny_serve_engine, *share_args) as server:
        log, answers, lock = [], [], threading.Lock()
        threads = _flood(server.url, FLOOD, log, lock, answers)
        backlog = 2 * SHARE + 4  # more of the flood's requests waiting than the fair bound lets pass
        _wait_for(server.url, backlog_gauge, backlog)
        with lock:
            log.append("B sent")
        with client(server.url, "127.0.0.2") as other:
            r = other.post("/v1/completions", json=SHORT)
        assert r.status_code == 200, r.text
        with lock:
            log.append("B done")
        for t in threads:
            t.join()
        wait_idle(server.url)
    assert log.count("A") == FLOOD and len(set(answers)) == 1, log  # every flood request answered, the same way
    passed = log[log.index("B sent"):log.index("B done")].count("A")  # flood requests that ended while B waited
    print(f"client share {share_args or 'default'}: {passed} of the flood's requests ended while B waited")
    if share_args:
        # the executor's queue held >= backlog of them ahead of B; all but the one sharing B's batch end first
        assert passed >= backlog - 1, log
    else:
        # at most SHARE were past the door when B was sent, SHARE when it reached the executor: the rest wait
        assert passed <= 2 * SHARE, log


def test_a_lone_client_over_its_share_loses_nothing(tiny_server):
    url = tiny_server.url
    with client(url, "127.0.0.1") as c:
        alone = c.post("/v1/completions", json=LONG).json()["choices"][0]["text"]
    rejected = metrics(url).get('trtbuild_requests_rejected_total{status="429"}', 0)
    log, answers, lock = [], [], threading.Lock()
    threads = _flood(url, 3 * SHARE, log, lock, answers)
    full_while_held = False  # both slots running while some of its requests wait at the door
    while any(t.is_alive() for t in threads) and not full_while_held:
        m = metrics(url)
        full_while_held = m["trtbuild_client_share_waiting"] > 0 and m["trtbuild_running_requests"] == 2
        time.sleep(0.01)
    for t in threads:
        t.join()
    m = wait_idle(url)
    assert log == ["A"] * 3 * SHARE and answers == [alone] * 3 * SHARE
    assert m.get('trtbuild_requests_rejected_total{status="429"}', 0) == rejected
    assert m["trtbuild_client_share_waiting"] == 0
    assert full_while_held


def test_the_door_keeps_each_clients_order_and_passes_on_cancelled_turns():
    """The bookkeeping itself (server/client_share.py's ClientShare), on a real event loop: a client's held
    requests go on oldest first as its own end, other addresses pass meanwhile, a wait cancelled before its
    turn leaves the queue, and a turn given to a wait cancelled before it resumed goes to the next one."""
    async def scenario() -> None:
        door = ClientShare(1)
        assert door.passes("a") and not door.passes("a")
        first, second, third = (asyncio.ensure_future(door.wait_turn("a")) for _ in range(3))
        await asyncio.sleep(0)
        assert door.held == 3 and door.passes("b")  # another address is not held
        second.cancel()
        await asyncio.sleep(0)
        assert door.held == 2 and second.cancelled()
        door.leave("a")  # a's request ends: its place goes to the oldest wait
        await asyncio.sleep(0)
        assert first.done() and not third.done() and door.held == 1
        door.leave("a")
        await asyncio.sleep(0)
        assert third.done() and door.held == 0
        door.leave("a")
        door.leave("b")
        assert not door.passed and not door.waiting  # nothing kept per address once it has nothing in flight

        assert door.passes("c")
        given, next_one = asyncio.ensure_future(door.wait_turn("c")), asyncio.ensure_future(door.wait_turn("c"))
        await asyncio.sleep(0)
        door.leave("c")  # the turn is given to `given`...
        given.cancel()  # ...which is cancelled before it runs again: the turn goes on
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert given.cancelled() and next_one.done() and door.held == 0 and door.passed["c"] == 1
        door.leave("c")
        assert not door.passed and not door.waiting

    asyncio.run(scenario())
