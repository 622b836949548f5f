"""The router's Prometheus metrics, per backend, in a registry of its own.

    trtbuild_router_backend_requests_total{backend}   requests forwarded to it (each retry counts once more)
    trtbuild_router_backend_errors_total{backend}     of those, the ones it failed: unreachable, cut, or 5xx
    trtbuild_router_backend_in_flight{backend}        forwarded and not yet ended (streams included)
    trtbuild_router_backend_healthy{backend}          1 while it takes requests, 0 while it is out
    trtbuild_router_retries_total                     requests sent to another backend after one failed
    trtbuild_router_stream_aborts_total               streams ended with an error event (backend died mid-stream)
    trtbuild_router_unrouted_total                    requests answered 503: no healthy backend left
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_builder.router.backends import BackendPool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _PoolCollector(Collector):
    """In-flight and health, read from the pool at scrape time (never stale)."""

    def __init__(self, pool: BackendPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily("trtbuild_router_backend_in_flight", "Requests forwarded to the backend and "
                                      "not yet ended (streams included).", labels=["backend"])
        healthy = GaugeMetricFamily("trtbuild_router_backend_healthy", "1 while the backend takes requests, 0 while "
                                    "it is taken out (unreachable or failing its health check).", labels=["backend"])
        for b in self._pool.backends:
            in_flight.add_metric([b.url], b.in_flight)
            healthy.add_metric([b.url], 1.0 if b.healthy else 0.0)
        yield in_flight
        yield healthy


class RouterMetrics:
    def __init__(self, pool: BackendPool) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("trtbuild_router_backend_requests", "Requests forwarded to the backend (a retried "
                                "request counts once per backend it was sent to).", ["backend"], registry=r)
        self.errors = Counter("trtbuild_router_backend_errors", "Forwarded requests the backend failed: unreachable, "
                              "connection cut, or a 5xx answer.", ["backend"], registry=r)
        self.retries = Counter("trtbuild_router_retries", "Requests sent to another backend after one failed before "
                               "anything was streamed.", registry=r)
        self.stream_aborts = Counter("trtbuild_router_stream_aborts", "Streams ended with an error event because "
                                     "their backend failed mid-stream.", registry=r)
        self.unrouted = Counter("trtbuild_router_unrouted", "Requests answered 503 because no healthy backend was "
                                "left to try.", registry=r)
        for b in pool.backends:  # every backend shows from the first scrape, at 0
            self.requests.labels(b.url)
            self.errors.labels(b.url)
        r.register(_PoolCollector(pool))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
