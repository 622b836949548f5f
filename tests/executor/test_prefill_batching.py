"""Batched prefill (runner/batched_prefill.py, runner/scheduling/prefill_groups.py) on the real SmolLM2 engine, slot
layout: ragged prompts prefilled in ONE engine call, a prefix-cache hit among them and a decoding request
riding along, give every request the tokens it gets alone, greedy or sampled (seeds, temperatures, top_k,
top_p and repetition penalties all different)."""

from __future__ import annotations

import numpy as np
import pytest
from prefill_logits import claimed_requests, decode_to_end, shared_logits, solo_logits

from engine_builder import SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.runner.batched_prefill import fits, prefill_together, start
from engine_builder.runner.scheduling.prefill_groups import CallCosts
from engine_builder.server.metrics import _kv_metrics

# the long one is >16 tokens: its reference run caches its first block, so in the batch its row starts at 16
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "In the old harbour town, the fishermen gathered every morning before dawn to mend their nets"]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0)


GREEDY = [_greedy(10), _greedy(12), _greedy(8), _greedy(9)]
# every row its own seed and warpers: a mix-up of rows' params, generators or penalty contexts shows
SAMPLED = [SamplingParams(max_new_tokens=10, temperature=1.0, seed=11),
           SamplingParams(max_new_tokens=12, temperature=0.8, top_k=40, seed=12),
           SamplingParams(max_new_tokens=8, temperature=1.3, top_p=0.9, repetition_penalty=1.3, seed=13),
           SamplingParams(max_new_tokens=9, temperature=0.7, top_k=20, top_p=0.95, seed=2**31 - 1)]


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


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_ragged_prompts_in_one_call_with_a_rider_equal_each_alone(any_llm, params):
    llm = any_llm
    alone = [llm.generate(p, sp)[0].token_ids for p, sp in zip(PROMPTS, params)]
    gen, kv = llm.generator, llm.backend.kv
    with claimed_requests(gen, [llm.encode(p) for p in PROMPTS], params) as requests:
        for r in requests:
            gen.admit(r)  # slots 0..3
        group, rider, cached = [requests[0], requests[2]], requests[1], requests[3]
        starts = {r.slot: start(gen, r) for r in group}
        lengths = [len(r.prompt_ids) for r in group]
        assert starts == {0: 0, 2: 0} and len(set(lengths)) == 2  # ragged: one row is padded
        # the long prompt's reference run cached its first block: its row would start at 16, and a call with a
        # row past 0 takes the generic attention branch on graphs with the If (a call per row without it)
        assert start(gen, cached) == 16 and not fits(gen, {**starts, 3: 16}, [*lengths, len(cached.prompt_ids) - 16])
        events: list = []
        fed = prefill_together(gen, group, events)  # slot 1, admitted but not prefilled, rides along at 0
        assert fed == 3 * max(lengths)  # slots 0..2 at the widest row's width
        assert [kv.length(r.slot) for r in group] == lengths and kv.length(rider.slot) == 0
        gen.prefill(rider, events)
        gen.prefill(cached, events)
        assert not fits(gen, {0: 0, 2: 0}, lengths)  # slot 1 now decodes: it may not ride in a shared call
        decode_to_end(gen, requests, events)
    assert [tuple(r.token_ids) for r in requests] == [tuple(a) for a in alone]


def test_a_shared_call_computes_each_rows_solo_logits_bit_for_bit(llm):
    """Why the tokens above can be exact for sampled requests too: a seeded draw walks the inverse CDF over the
    whole vocab, so a logit difference of 5e-5 (the generic attention branch's, taken when a row starts past 0)
    flips 1e-4 to 2e-2 of draws (benchmarks/prefill_branch_numerics.py). Rows that all start at 0 get exactly
    their solo call's logits."""
    prompts = [llm.encode(p) for p in PROMPTS[:3]]
    solo, shared = solo_logits(llm.backend, prompts), shared_logits(llm.backend, prompts)
    assert all(np.array_equal(a, b) for a, b in zip(solo, shared))


def test_prompts_arriving_together_share_a_call_through_the_executor(llm):
    params = [_greedy(6), SamplingParams(max_new_tokens=7, temperature=1.0, seed=5),
              SamplingParams(max_new_tokens=5, temperature=0.8, seed=3), _greedy(6)]
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


# A text no other test prompts with: none of its blocks is in the session's prefix cache
LIGHTHOUSE = ("Far to the north, the lighthouse keeper counted the passing ships each night and wrote their "
              "names in a leather book, along with the wind, the tide and whatever the gulls had done that day")


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_a_prefix_stored_earlier_in_the_step_does_not_reshape_a_planned_call(llm, sampled):
    """The CI failure behind the greedy-only guard (tests/server/test_serve_concurrency.py, two clients whose
    prompts share their first 16 tokens arrive together): the step plans [a] alone, then [c, d] in one call of
    width 20. Running [a] stores a's first block, d's 16-token prefix. The call used to copy that block into d's
    slot when it ran, making d's row 4 tokens long: its padding (16) reached past the graph's 16 logits, and
    its first token was sampled from the logits of a padding position. The lookup now happens once, at
    planning, so d's row is the 20 tokens the plan sized."""
    tag = llm.encode("Sampled" if sampled else "Greedy")[:1]  # one token: no block of one variant in the other
    ids = llm.encode(LIGHTHOUSE)
    a, b, c = tag + ids[:39], tag + ids[5:34], tag + ids[10:29]  # 40, 30 and 20 tokens
    d = a[:16] + ids[30:34]  # starts with a's first block
    def params(i: int) -> SamplingParams:
        if not sampled:
            return _greedy(4)
        return SamplingParams(max_new_tokens=4, temperature=(1.0, 0.8, 1.2, 0.9)[i], top_k=(0, 0, 50, 0)[i],
                              seed=100 + i, logprobs=0)
    hits = llm.generator.prefix_cache.stats().hit_tokens
    with Executor(llm) as executor:
        with executor._lock:  # all four are admitted, and planned, in one step
            handles = [executor.submit(p, params(i)) for i, p in enumerate((a, b, c, d))]
        outs = [h.result(timeout=120) for h in handles]
        stats = executor.stats()
    hits_in_step = llm.generator.prefix_cache.stats().hit_tokens - hits
    # each alone, after: d now finds a's block cached (a solo call of 4 tokens gives the same logits)
    alone = [llm.generate(params=params(i), prompt_token_ids=[p])[0] for i, p in enumerate((a, b, c, d))]
    assert [o.token_ids for o in outs] == [r.token_ids for r in alone]
    assert (stats.batched_prefill_calls, stats.batched_prefill_requests) == (1, 2)  # [a], [b], then [c, d]
    assert hits_in_step == 0  # d was planned, and ran, without a's block


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
