"""Batched prefill (runner/batched_prefill.py, executor/prefill_groups.py) on the real SmolLM2 engine, slot
layout: ragged prompts prefilled in ONE engine call, a prefix-cache hit among them and a decoding request
riding along, give every request the tokens it gets alone."""

from __future__ import annotations

import pytest

from engine_builder import SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.executor.prefill_groups import CallCosts
from engine_builder.runner.batched_prefill import fits, prefill_together, start
from engine_builder.server.metrics import _kv_metrics

# the long one is >16 tokens: its reference run caches its first block, so in the batch its row starts at 16
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "In the old harbour town, the fishermen gathered every morning before dawn to mend their nets"]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0)


@pytest.fixture(params=["default", "gqa"])
def any_llm(request, llm):
    """The session's engine, and the one lowered to GroupQueryAttention (its kernel takes ragged rows in place)."""
    if request.param == "default":
        yield llm
        return
    from engine_builder import LLM

    gqa = LLM(request.getfixturevalue("smollm2_gqa_engine"), backend="onnxruntime")
    yield gqa
    gqa.close()


def test_ragged_prompts_in_one_call_with_a_rider_equal_each_alone(any_llm):
    llm = any_llm
    params = [_greedy(10), _greedy(12), _greedy(8), _greedy(9)]
    alone = [llm.generate(p, sp)[0].token_ids for p, sp in zip(PROMPTS, params)]
    gen, kv = llm.generator, llm.backend.kv
    gen.claim("test", "wait for the test")
    requests = [gen.new_request(i, llm.encode(p), sp) for i, (p, sp) in enumerate(zip(PROMPTS, params))]
    try:
        for r in requests:
            gen.admit(r)  # slots 0..3
        rider = requests[1]
        events: list = []
        gen.prefill(rider, events)  # slot 1 decodes alone for a step, then rides along in the batched prefill
        gen.decode({1: rider}, events)
        group = [requests[0], requests[2], requests[3]]
        starts = {r.slot: start(gen, r) for r in group}
        assert starts[3] == 16  # the prefix-cache hit: the long prompt's row starts past its cached block
        lengths = [len(r.prompt_ids) - starts[r.slot] for r in group]
        assert len(set(lengths)) == 3 and fits(gen, starts, lengths)  # ragged: two rows are padded
        fed = prefill_together(gen, group, events)
        assert fed == 4 * max(lengths)  # slots 0..3 at the widest row's width
        assert [kv.length(r.slot) for r in group] == [len(r.prompt_ids) for r in group]
        active = {r.slot: r for r in requests}
        while active:
            gen.decode(active, events)
    finally:
        for r in requests:
            if r.slot is not None:
                gen.release(r)
        gen.unclaim()
    assert [tuple(r.token_ids) for r in requests] == [tuple(a) for a in alone]


def test_prompts_arriving_together_share_a_call_through_the_executor(llm):
    params = [_greedy(6), _greedy(7), SamplingParams(max_new_tokens=5, temperature=0.8, seed=3), _greedy(6)]
    alone = [llm.generate(p, sp)[0] for p, sp in zip(PROMPTS, params)]
    with Executor(llm) as executor:
        with executor._lock:  # reentrant: all four are queued before the loop's next step takes any
            handles = [executor.submit(llm.encode(p), sp) for p, sp in zip(PROMPTS, params)]
        outs = [h.result(timeout=120) for h in handles]
        stats = executor.stats()
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert [o.text for o in outs] == [a.text for a in alone]
    assert stats.batched_prefill_calls >= 1 and stats.batched_prefill_requests >= 2
    counters = {m.name: m.samples[0].value for m in _kv_metrics(stats)}  # what /metrics shows
    assert counters["trtbuild_batched_prefill_requests"] == stats.batched_prefill_requests
    assert counters["trtbuild_batched_prefill_calls"] == stats.batched_prefill_calls


def test_batch_prefill_off_gives_every_prompt_its_own_call(llm):
    with Executor(llm, SchedulerConfig(batch_prefill=False)) as executor:
        with executor._lock:
            handles = [executor.submit(llm.encode(p), _greedy(2)) for p in PROMPTS[:3]]
        for h in handles:
            h.result(timeout=120)
        assert executor.stats().batched_prefill_calls == 0


def test_call_costs_fit_fixed_and_per_token_cost():
    costs = CallCosts()
    assert costs.fixed_tokens() == 8.0  # nothing measured: the default
    for tokens in (1, 7, 21, 35, 8, 56):
        costs.observe(tokens, 0.036 + 0.0045 * tokens)
    assert abs(costs.fixed_tokens() - 8.0) < 1e-6  # 36 ms fixed / 4.5 ms a token
    flat = CallCosts()
    for tokens in (1, 8, 64):
        flat.observe(tokens, 0.01)  # size does not matter: batch freely
    assert flat.fixed_tokens() == 1e9


def test_a_failed_shared_call_fails_its_requests_and_the_executor_lives_on(smollm2_engine):
    from engine_builder import LLM

    llm = LLM(smollm2_engine, backend="onnxruntime")  # its own: the backend is closed under the executor
    llm.backend.close()  # a real onnxruntime failure in the shared prefill call
    executor = Executor(llm)
    with executor._lock:
        handles = [executor.submit(llm.encode(p), _greedy(4)) for p in PROMPTS[:3]]
    finals = [list(h.events(timeout=60))[-1] for h in handles]
    assert [e.finish_reason for e in finals] == ["error"] * 3
    stats = executor.stats()
    assert executor.alive and stats.batched_prefill_calls == 1 and stats.requests_failed == 3
    assert (stats.running, stats.free_slots) == (0, 4)
    executor.shutdown()
    assert llm.backend.kv.num_free == 4
