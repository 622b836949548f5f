"""`trtbuild route` over two real `trtbuild serve` replicas, as real processes on real sockets, through the
official openai client: the replicas' exact tokens, streams passed through, failover when a replica is
SIGKILLed, the replica put back when it returns, and prefix-aware routing."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from hung_replica import HungReplica
from route_processes import HEALTH_INTERVAL_S, Router, free_port
from typer.testing import CliRunner

from engine_builder.cli.commands import app

MODEL = "tiny"


def client(url: str) -> openai.OpenAI:
    # no retries: a request the router loses must fail here, not be resent by the client
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def prompt(i: int) -> str:
    return " ".join(f"w{(i * 7 + j) % 300 + 3}" for j in range(6))


def completion(url: str, i: int, max_tokens: int = 24) -> str:
    r = client(url).completions.create(model=MODEL, prompt=prompt(i), max_tokens=max_tokens, temperature=0)
    return r.choices[0].text


def stream_text(url: str, i: int, max_tokens: int = 24) -> str:
    chunks = client(url).completions.create(model=MODEL, prompt=prompt(i), max_tokens=max_tokens, temperature=0,
                                            stream=True)
    return "".join(c.choices[0].text for c in chunks if c.choices)


def test_openai_and_tgi_through_the_router_equal_a_replica(replicas, router_for):
    direct, router = replicas[0].url, router_for("round-robin")
    messages = [{"role": "user", "content": "w5 w6 w7"}]
    for _ in range(2):  # round-robin: each replica answers once
        via = client(router.url).chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        ref = client(direct).chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        assert via.choices[0].message.content == ref.choices[0].message.content
        assert via.usage == ref.usage
        assert completion(router.url, 1) == completion(direct, 1)
        # a stream is passed through event by event: the same text, then finish_reason
        assert stream_text(router.url, 2) == completion(direct, 2)
    chat_stream = client(router.url).chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                             temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chat_stream if c.choices) == \
        ref.choices[0].message.content

    # TGI routes
    body = {"inputs": prompt(3), "parameters": {"max_new_tokens": 12}}
    tgi = httpx.post(f"{router.url}/generate", json=body, timeout=60)
    assert tgi.status_code == 200 and tgi.json() == httpx.post(f"{direct}/generate", json=body, timeout=60).json()
    with httpx.stream("POST", f"{router.url}/generate_stream", json=body, timeout=60) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data:")]
    assert events[-1]["generated_text"] == tgi.json()["generated_text"]

    # a 4xx is the replica's own, unchanged; the router's /v1/models is the replicas'
    bad = {"model": MODEL, "prompt": "w3", "max_tokens": -5}
    via, ref = (httpx.post(f"{u}/v1/completions", json=bad, timeout=60) for u in (router.url, direct))
    assert via.status_code == ref.status_code == 400 and via.json() == ref.json()
    assert httpx.get(f"{router.url}/v1/models", timeout=30).json()["data"][0]["id"] == MODEL

    m = router.metrics()
    for r in replicas:  # both took requests; none failed
        assert m[f'trtbuild_router_backend_requests_total{{backend="{r.url}"}}'] >= 4
        assert m[f'trtbuild_router_backend_errors_total{{backend="{r.url}"}}'] == 0
        assert m[f'trtbuild_router_backend_in_flight{{backend="{r.url}"}}'] == 0


def test_prefix_aware_sends_a_shared_prefix_to_one_replica(replicas, router_for):
    router = router_for("prefix-aware")
    before = {r.url: router.backend_metric("requests_total", r.url) for r in replicas}
    system_a = {"role": "system", "content": " ".join(f"w{i}" for i in range(10, 22))}
    system_b = {"role": "system", "content": " ".join(f"w{i}" for i in range(200, 212))}
    served = {}
    for system in (system_a, system_b):
        for q in range(6):
            messages = [system, {"role": "user", "content": f"w{30 + q} w{40 + q}"}]
            client(router.url).chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        now = {r.url: router.backend_metric("requests_total", r.url) for r in replicas}
        served[system["content"]] = {url: now[url] - before[url] for url in now}
        before = now
    # each system prompt's six turns went to one replica, and the second prompt to the other (less cached) one
    a, b = served[system_a["content"]], served[system_b["content"]]
    assert sorted(a.values()) == [0, 6] and sorted(b.values()) == [0, 6], served
    assert max(a, key=a.get) != max(b, key=b.get), served


def test_sigkill_of_a_replica_mid_load_loses_no_request_and_it_is_put_back(replicas, router_for):
    n = 50
    expected = {i: completion(replicas[0].url, i) for i in range(n)}
    router = router_for("round-robin")
    victim = replicas[1]
    done = []
    killed = threading.Event()

    def one(i: int) -> str:
        text = completion(router.url, i)
        done.append(i)
        if len(done) == 10 and not killed.is_set():
            killed.set()
            # the kill must catch requests on the victim (the premise of the test): wait until the router has some
            deadline = time.monotonic() + 30
            while router.backend_metric("in_flight", victim.url) == 0:
                assert time.monotonic() < deadline, f"no request in flight on {victim.url}: {router.log()}"
                time.sleep(0.01)
            victim.kill()  # ~40 requests are still queued or running, half of them on the victim
        return text

    with ThreadPoolExecutor(16) as pool:
        got = dict(zip(range(n), pool.map(one, range(n))))
    assert killed.is_set()
    assert got == expected  # all 50 answered, each with the replica's exact tokens
    router.wait_healthy(victim.url, healthy=False)
    m = router.metrics()
    assert m[f'trtbuild_router_backend_errors_total{{backend="{victim.url}"}}'] >= 1, router.log()
    assert m["trtbuild_router_retries_total"] >= 1, router.log()
    assert m["trtbuild_router_unrouted_total"] == 0

    # the restarted replica is put back by the health checks, and takes requests again
    victim.restart()
    router.wait_healthy(victim.url)
    before = router.backend_metric("requests_total", victim.url)
    for i in range(4):
        assert completion(router.url, i) == expected[i]
    assert router.backend_metric("requests_total", victim.url) >= before + 2


def test_a_stream_whose_replica_dies_before_its_first_byte_is_served_by_another(replicas, router_for):
    router = router_for("round-robin")
    victim = replicas[1]
    expected = completion(replicas[0].url, 5)
    victim.server.proc.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does) but never answers
    try:
        with ThreadPoolExecutor(2) as pool:  # round-robin: one of the two streams goes to the frozen replica
            streams = [pool.submit(stream_text, router.url, 5) for _ in range(2)]
            time.sleep(1.0)
            victim.kill()
            assert [s.result(timeout=60) for s in streams] == [expected, expected]
    finally:
        if victim.server.proc.poll() is None:
            victim.kill()
        victim.restart()
    assert router.metrics()["trtbuild_router_retries_total"] >= 1
    router.wait_healthy(victim.url)


def test_no_backend_left_is_a_503_in_the_api_shape(tiny_serve_engine):
    router = Router([f"http://127.0.0.1:{free_port()}"], "least-load")  # nothing listens there
    try:
        with openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0) as c:
            try:
                c.completions.create(model=MODEL, prompt="w3", max_tokens=2)
                raise AssertionError("no backend, yet the request succeeded")
            except openai.InternalServerError as exc:
                assert exc.status_code == 503 and "no healthy backend" in exc.message
        r = httpx.post(f"{router.url}/generate", json={"inputs": "w3"}, timeout=30)
        assert r.status_code == 503 and r.json()["error_type"] == "unhealthy" and r.headers["retry-after"] == "1"
        assert httpx.get(f"{router.url}/health", timeout=30).status_code == 503
    finally:
        assert router.stop() == 0


def test_bad_cli_input_fails_in_one_line():
    cases = [((), "no backend given"),
             (("--backend", "localhost:8000"), "is not an http(s) URL"),
             (("--backend", "http://a:1", "--backend", "http://a:1/"), "given twice"),
             (("--backend", "http://a:1", "--policy", "random"), "is not one of round-robin, least-load, prefix-aware"),
             (("--backend", "http://a:1", "--port", "70000"), "--port must be in [0, 65535]"),
             (("--backend", "http://a:1", "--health-interval", "0"), "--health-interval must be > 0")]
    for args, needle in cases:  # in this process: each is refused before anything listens
        r = CliRunner().invoke(app, ["route", *args])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (
            args, r.stderr)


def test_a_hung_replica_is_timed_out_taken_out_and_the_request_served_by_another(replicas):
    """Issue 36 MEDIUM 6: a replica answering /health but no request held every client for 630 s."""
    hung = HungReplica()
    try:
        for stream in (False, True):  # a router each: the first request meets the hung replica (round-robin)
            router = Router([hung.url, replicas[0].url], "round-robin", HEALTH_INTERVAL_S, "--first-byte-timeout", "1")
            try:
                router.wait_healthy(hung.url)
                router.wait_healthy(replicas[0].url)
                client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0, timeout=120)
                for _ in range(2):
                    r = client.completions.create(model="tiny", prompt="w3 w4", max_tokens=3, stream=stream)
                    assert (list(r) if stream else r.choices)
                assert router.backend_metric("healthy", hung.url) == 0  # held out though its /health answers
                assert router.metrics()["trtbuild_router_retries_total"] == 1  # the second request never met it
                assert "no first byte within 1 s" in router.log()
            finally:
                assert router.stop() == 0
        assert hung.requests == 2
    finally:
        hung.close()


def test_a_client_that_leaves_before_the_first_byte_cancels_the_upstream_request():
    hung = HungReplica()
    router = Router([hung.url], "round-robin", HEALTH_INTERVAL_S, "--first-byte-timeout", "600")
    try:
        router.wait_healthy(hung.url)
        try:
            httpx.post(f"{router.url}/v1/completions", json={"prompt": "w3", "max_tokens": 2}, timeout=0.5)
        except httpx.TimeoutException:
            pass  # the client gives up and closes its connection
        deadline = time.monotonic() + 60
        while hung.closed < 1:  # the router closes its request to the replica (serve would cancel it)
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.05)
        assert hung.requests == 1 and router.backend_metric("healthy", hung.url) == 1  # not the replica's fault
    finally:
        hung.close()
        assert router.stop() == 0


def test_replicas_see_the_clients_address_not_one_it_wrote_itself(replicas):
    """The router appends the client's address to X-Forwarded-For (serve trusts the router's header and counts
    --max-concurrent-per-client by it); a client-written X-Forwarded-For passed through before, unchecked."""
    router = Router([replicas[0].url], "round-robin")
    try:
        router.wait_healthy(replicas[0].url)
        transport = httpx.HTTPTransport(local_address="127.0.0.2")  # an address serve does not trust as a proxy
        with httpx.Client(transport=transport, timeout=60) as client:
            r = client.post(f"{router.url}/generate", headers={"X-Forwarded-For": "10.9.9.9"},
                            json={"inputs": "w3 w4", "parameters": {"max_new_tokens": 2}})
        assert r.status_code == 200
        log = replicas[0].server.log()
        assert '127.0.0.2 "POST /generate"' in log and "10.9.9.9" not in log
    finally:
        assert router.stop() == 0
