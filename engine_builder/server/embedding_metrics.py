"""Prometheus metrics of an embedding server, read from EmbeddingBatcher.stats() at scrape time (a registry
of its own, as server/metrics.py does, so two servers in one process never collide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_builder.executor.embedding_batcher import EmbeddingStats


class _BatcherCollector(Collector):
    def __init__(self, stats: Callable[[], EmbeddingStats], active: Callable[[], int]) -> None:
        self._stats, self._active = stats, active

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        yield GaugeMetricFamily("trtbuild_embedding_queue_depth", "Embedding requests waiting", value=s.queue_depth)
        yield GaugeMetricFamily("trtbuild_embedding_active_requests", "Admitted requests not yet answered",
                                value=self._active())
        yield CounterMetricFamily("trtbuild_embedding_requests", "Embedding requests answered",
                                  value=s.requests_finished)
        yield CounterMetricFamily("trtbuild_embedding_requests_failed", "Embedding requests that failed",
                                  value=s.requests_failed)
        yield CounterMetricFamily("trtbuild_embedding_texts", "Texts embedded", value=s.texts)
        yield CounterMetricFamily("trtbuild_embedding_steps", "Engine calls, each over one or more requests",
                                  value=s.steps)


def embedding_metrics(stats: Callable[[], EmbeddingStats], active: Callable[[], int]) -> Callable[[], bytes]:
    """A function returning the exposition text of these metrics."""
    registry = CollectorRegistry()
    registry.register(_BatcherCollector(stats, active))
    return lambda: generate_latest(registry)
