"""/metrics of a `serve --speculative` server: what the speculative decode policy counted, read at scrape time
(runner/speculative/stats.py; cumulative since the server started, as Prometheus counters are).

    trtbuild_speculative_draft_tokens_total      tokens the proposer drafted and the target verified
    trtbuild_speculative_accepted_tokens_total   of those, tokens the target kept
    trtbuild_speculative_emitted_tokens_total    tokens verify steps produced (accepted + a correction or bonus each)
    trtbuild_speculative_verify_steps_total      requests' verify steps (a request's drafts checked once)
    trtbuild_speculative_batched_verify_steps_total  engine steps that verified several requests together
    trtbuild_speculative_plain_steps_total       one-token steps (no drafts, or the adaptive length chose 0)
    trtbuild_speculative_acceptance_rate         accepted / drafted, since start
    trtbuild_speculative_mean_accepted_length    emitted / verify steps: tokens per verify step (1.0: no gain)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_builder.runner.speculative import SpeculativeDecode

if TYPE_CHECKING:
    from engine_builder.executor import Executor


class _SpeculativeCollector(Collector):
    def __init__(self, speculation: SpeculativeDecode) -> None:
        self._speculation = speculation

    def collect(self) -> Iterator[Metric]:
        s = self._speculation.stats  # plain ints the executor thread bumps: a scrape reads a consistent-enough view
        method = s.method
        for name, value, text in (
                ("draft_tokens", s.draft_tokens, "Tokens drafted by the proposer and verified by the target."),
                ("accepted_tokens", s.accepted_tokens, "Drafted tokens the target kept."),
                ("emitted_tokens", s.emitted_tokens, "Tokens verify steps produced (accepted drafts + the "
                                                     "target's own token each)."),
                ("verify_steps", s.verify_steps, "Requests' verify steps (each request's drafts checked once)."),
                ("batched_verify_steps", s.batched_verify_steps, "Engine steps that verified several requests' "
                                                                 "drafts together."),
                ("plain_steps", s.plain_steps, "One-token steps (no drafts proposed, or the adaptive length chose "
                                               "0).")):
            counter = CounterMetricFamily(f"trtbuild_speculative_{name}", text, labels=["method"])
            counter.add_metric([method], value)
            yield counter
        for name, value, text in (
                ("acceptance_rate", s.acceptance_rate, "Accepted / drafted tokens since the server started."),
                ("mean_accepted_length", s.mean_accepted_length, "Tokens per verify step since the server started "
                                                                 "(1.0 means no gain).")):
            gauge = GaugeMetricFamily(f"trtbuild_speculative_{name}", text, labels=["method"])
            gauge.add_metric([method], value)
            yield gauge


def register_speculative(registry: CollectorRegistry, executor: Executor) -> None:
    """Add the speculative metrics when the executor's LLM speculates (`serve --speculative`)."""
    speculation = executor.llm.speculation
    if speculation is not None:
        registry.register(_SpeculativeCollector(speculation))
