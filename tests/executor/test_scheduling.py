"""Scheduler policies on a real engine (runner/scheduling/scheduler.py, admission.py, chunked_prefill.py,
preemption.py): KV-budget admission, chunked prefill equal to one-shot prefill, priority order, preemption by
recompute with identical tokens. A tiny random Llama with 32 KV slots of 1,024 positions, built from the tiny serve
engine's checkpoint; every answer is compared with the same request run alone on an LLM without a prefix cache."""

from __future__ import annotations

import time

import numpy as np
import pytest
from runner_engines import build_engine

from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.formats.build_config import Limits
from engine_builder.runner.scheduling.admission import Room, plan_admission
from engine_builder.runner.scheduling.chunked_prefill import plan_chunks
from engine_builder.util.errors import InputError

WIDE = Limits(max_batch=32, max_input_len=128, max_seq_len=1024)


@pytest.fixture(scope="module")
def wide_engine(tiny_serve_engine):
    return build_engine(tiny_serve_engine.parent / "ckpt", tiny_serve_engine.parent / "engine-wide", WIDE)


@pytest.fixture(scope="module")
def alone(wide_engine):
    """Each request run alone: what every scheduled run must reproduce token for token."""
    llm = LLM(wide_engine, prefix_cache=False)
    yield lambda ids, params: llm.generate(prompt_token_ids=[ids], params=params)[0]
    llm.close()


@pytest.fixture
def llm(wide_engine):
    llm = LLM(wide_engine)
    yield llm
    assert llm.backend.kv.num_free == llm.backend.kv.batch_slots  # nothing leaked
    llm.close()


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 320, n)]


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True, **kw)


def _wait_tokens(handle, n: int) -> None:
    for _ in handle.events(timeout=60):
        if len(handle.token_times) >= n or handle.finished:
            return


def test_budget_of_four_full_sequences_runs_32_short_requests_at_once(llm, alone):
    budget = 4 * WIDE.max_seq_len  # what 4 requests of max_seq_len hold: slot admission would run 4 at a time
    prompts = [_prompt(i, 36 + i % 8) for i in range(32)]  # ~100 tokens each with the answer: 7 blocks
    params = _greedy(64)
    with Executor(llm, SchedulerConfig(kv_budget_tokens=budget)) as executor:
        stats = executor.stats()
        assert (stats.kv_blocks_total, stats.kv_block_tokens) == (budget // 16, 16)
        handles = [executor.submit(p, params) for p in prompts]
        outs = [h.result(timeout=120) for h in handles]
        assert executor.stats().kv_blocks_used == 0
    # all 32 ran together: the last first token came before the first request's last token
    assert max(h.first_token_time for h in handles) < min(h.token_times[-1] for h in handles)
    for p, out in zip(prompts, outs):
        assert out.token_ids == alone(p, params).token_ids


def test_budget_bounds_the_running_requests(llm, alone):
    prompts = [_prompt(40 + i, 60) for i in range(6)]
    params = _greedy(20)  # 80 tokens: 5 blocks; a 12-block budget runs 2 at a time
    seen = []
    with Executor(llm, SchedulerConfig(kv_budget_tokens=12 * 16)) as executor:
        handles = [executor.submit(p, params) for p in prompts]
        with pytest.raises(InputError, match="the KV budget holds 12 "):
            executor.submit(_prompt(99, 60), _greedy(200))  # more than the whole budget: refused at once
        while not all(h.finished for h in handles):
            s = executor.stats()
            seen.append((s.running, s.kv_blocks_used))
            time.sleep(0.001)
        outs = [h.result() for h in handles]
    assert max(r for r, _ in seen) == 2 and max(b for _, b in seen) == 10
    assert [o.token_ids for o in outs] == [alone(p, params).token_ids for p in prompts]


def test_chunked_prefill_equals_one_shot_prefill_in_tokens_and_logits(llm, alone):
    long = _prompt(7, 120)
    params = _greedy(8, logprobs=5)
    with Executor(llm, SchedulerConfig(max_tokens_per_step=16)) as executor:
        running = executor.submit(_prompt(8, 10), _greedy(900))  # decodes all along; cancelled after
        _wait_tokens(running, 2)
        chunked = executor.submit(long, params)
        out = chunked.result(timeout=60)
        assert not running.finished
        running.cancel()
        steps = executor.stats().chunked_prefill_steps
    assert steps >= 120 // 16 - 1  # fed 16 tokens a step beside the decoding request
    want = alone(long, params)  # the whole prompt in one engine call
    assert out.token_ids == want.token_ids
    for got, ref in zip(out.logprobs, want.logprobs):  # the log-softmax of every step's logits: top 5 and sampled
        assert [t for t, _ in got.top] == [t for t, _ in ref.top]
        np.testing.assert_allclose([v for _, v in got.top], [v for _, v in ref.top], atol=1e-4)
        np.testing.assert_allclose(got.logprob, ref.logprob, atol=1e-4)


def test_chunks_share_the_budget_fairly():
    # the short prompt takes what it needs, the long ones share the rest; the urgent level is served first
    plan = plan_chunks([("long", 0, 1500), ("short", 0, 20), ("long2", 0, 900)], budget=64, max_chunk=2048)
    assert dict(plan) == {"short": 20, "long": 22, "long2": 22}
    plan = plan_chunks([("a", 1, 500), ("b", 0, 500)], budget=64, max_chunk=2048)
    assert plan == [("b", 64)]
    assert plan_chunks([("a", 0, 500)], budget=4096, max_chunk=128) == [("a", 128)]
    # no 1-token call for the budget's last sliver: the second prompt waits for the next step
    assert plan_chunks([("a", 0, 15), ("b", 0, 15)], budget=16, max_chunk=128) == [("a", 15)]
    assert plan_chunks([("a", 0, 40)], budget=8, max_chunk=128) == [("a", 8)]  # a budget below min_chunk still runs


def test_priority_orders_the_queue(llm, alone):
    order: list[str] = []
    params = {name: _greedy(4, priority=p) for name, p in (("low", 5), ("mid", 0), ("high", -5))}
    with Executor(llm, SchedulerConfig(max_batch=1)) as executor:
        blocker = executor.submit(_prompt(20, 10), _greedy(40, priority=-10))
        _wait_tokens(blocker, 1)
        handles = {name: executor.submit(_prompt(21 + i, 10), p) for i, (name, p) in enumerate(params.items())}
        blocker.result(timeout=60)
        for h in handles.values():
            h.result(timeout=60)
        order = sorted(handles, key=lambda n: handles[n].first_token_time)
        assert executor.stats().preemptions == 0  # the blocker is more urgent than all of them
    assert order == ["high", "mid", "low"]
    for i, (name, p) in enumerate(params.items()):
        assert handles[name].result().token_ids == alone(_prompt(21 + i, 10), p).token_ids


def test_preempted_requests_resume_with_identical_tokens(llm, alone):
    greedy, seeded = _greedy(200, priority=1), SamplingParams(max_new_tokens=200, temperature=0.9, seed=7,
                                                              ignore_eos=True, priority=1)
    urgent = _greedy(230)  # priority 0: needs both low-priority requests' blocks
    a, b, c = _prompt(30, 40), _prompt(31, 40), _prompt(32, 50)
    # 4 blocks short of what the two low-priority requests need, so the urgent one preempts both whatever
    # their head start when it arrives (with exactly their room, one of them finished before its preemption
    # once it had more than ~10 tokens at the urgent one's arrival, as on a loaded machine)
    blocks = 2 * -(-(40 + 200) // 16) - 4
    with Executor(llm, SchedulerConfig(kv_budget_tokens=blocks * 16, max_tokens_per_step=16)) as executor:
        low = [executor.submit(a, greedy), executor.submit(b, seeded)]
        for h in low:
            _wait_tokens(h, 5)
        first = executor.submit(c, urgent)
        outs = [h.result(timeout=120) for h in (*low, first)]
        stats = executor.stats()
    assert stats.preemptions >= 2  # a low-priority one readmitted into freed blocks can be preempted again
    assert all(len(h.token_times) == 200 for h in low)  # nothing streamed twice
    assert first.token_times[-1] < min(h.token_times[-1] for h in low)  # the urgent one finished first
    assert outs[0].token_ids == alone(a, greedy).token_ids
    assert outs[1].token_ids == alone(b, seeded).token_ids
    assert outs[2].token_ids == alone(c, urgent).token_ids


def test_a_long_request_is_overtaken_at_most_max_overtakes_times(llm):
    gen = llm.generator
    names = ("long", "s1", "s2", "s3", "s4")
    new = {name: gen.new_request(i, _prompt(i, 8), _greedy(4)) for i, name in enumerate(names)}
    need = {"long": 10, "s1": 2, "s2": 2, "s3": 2, "s4": 2}
    blocks = {r.index: need[name] for name, r in new.items()}
    skips: dict[int, int] = {}

    def plan(waiting, free_blocks):
        return plan_admission([new[n] for n in waiting], [], Room(8, free_blocks), need=lambda r: blocks[r.index],
                              held=lambda r: blocks[r.index], skips=skips, max_overtakes=2)

    # the long one does not fit: the short ones behind it use the free blocks instead of idling them
    assert [r.index for r in plan(["long", "s1", "s2"], 6).admit] == [1, 2]
    assert skips == {0: 2}
    # overtaken twice: now those behind it wait until it fits, so it is never starved
    assert plan(["long", "s3"], 6).admit == ()
    assert [r.index for r in plan(["long", "s3", "s4"], 10).admit] == [0]


def test_the_scheduler_returns_a_plan_and_the_step_carries_it_out(llm, alone):
    """schedule() decides the step (issue 32: the scheduler plans, never runs an engine): who was admitted, which
    context tokens each feeds, who decodes; run_engine_step carries out exactly that."""
    from engine_builder.runner.scheduling.engine_step import next_plan, run_engine_step, scheduler_for
    from engine_builder.runner.scheduling.prefill_groups import PrefillGroups

    gen, prefills = llm.generator, PrefillGroups(False)
    sched = scheduler_for(SchedulerConfig(max_tokens_per_step=16), gen)
    short, long = gen.new_request(0, _prompt(1, 10), _greedy(6)), gen.new_request(1, _prompt(2, 40), _greedy(6))
    sched.waiting.extend([short, long])
    try:
        plan = next_plan(sched, gen)  # nothing decodes: one engine call's worth of prompt tokens, so both whole
        assert (plan.admitted, plan.preempted) == ((short, long), ())
        assert plan.prefill == ((short, 10), (long, 40)) and plan.decode == (short, long)
        assert short.token_ids == [] and long.token_ids == []  # planned, nothing ran
        run_engine_step(sched, gen, plan, prefills)
        assert len(short.token_ids) == len(long.token_ids) == 2  # the prefill's first token, then one decode

        late = gen.new_request(2, _prompt(3, 40), _greedy(6))
        sched.waiting.append(late)
        plan = next_plan(sched, gen)  # two decode, so the late prompt gets the 16-token budget only
        assert plan.admitted == (late,) and plan.prefill == ((late, 16),) and plan.decode == (short, long)
        run_engine_step(sched, gen, plan, prefills)
        assert (len(short.token_ids), len(late.token_ids)) == (3, 0)
        while sched.running:
            plan = next_plan(sched, gen)
            run_engine_step(sched, gen, plan, prefills)
            sched.retire_finished()
        for r in (short, long, late):  # chunked or whole, alone or beside others: the same tokens
            assert r.token_ids == list(alone(r.prompt_ids, r.params).token_ids)
    finally:
        for r in sched.remove(sched.all_ids):
            if r.slot is not None:
                gen.release(r)
