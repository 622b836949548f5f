"""LLM.generate admitted by free KV blocks (runner/scheduling/block_admission.py), on real engines.

A tiny random Llama with 32 KV slots of 1,024 positions, slot and paged layouts, built from the tiny serve
engine's checkpoint. With a KV budget (slots) or a block pool (paged) of 4 full sequences, 32 requests of ~100
tokens run at once; requests whose prompt + max_new_tokens do not all fit reserved (what LLM.generate used to
take up front: a CapacityError on the paged pool) all run, preempted by recompute as blocks run out. Every
answer equals the same request run alone (greedy and seeded), and nothing leaks: no slot, no budget block, no
pool block but the prefix cache's own.
"""

from __future__ import annotations

import numpy as np
import pytest
from runner_engines import build_engine, build_paged_engine

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.util.errors import ConfigError, InputError

WIDE = Limits(max_batch=32, max_input_len=64, max_seq_len=1024)
BLOCK = 16  # the paged engine's block, = the scheduler's


@pytest.fixture(scope="module")
def engines(tiny_serve_engine, module_tmp_factory):
    root, ckpt = module_tmp_factory.mktemp("generate-admission"), tiny_serve_engine.parent / "ckpt"
    slots = build_engine(ckpt, root / "slots", WIDE)
    return slots, build_paged_engine(ckpt, root / "paged", WIDE, BLOCK)


@pytest.fixture(scope="module")
def alone(engines):
    """Each request run alone on the slot engine (memoized): what every admitted run must reproduce."""
    llm, seen = LLM(engines[0], prefix_cache=False), {}

    def run(prompt: list[int], params: SamplingParams) -> tuple[int, ...]:
        key = (tuple(prompt), repr(params))
        if key not in seen:
            seen[key] = llm.generate(prompt_token_ids=[prompt], params=params)[0].token_ids
        return seen[key]

    yield run
    llm.close()


def _requests(n: int, max_new: int) -> list[tuple[list[int], SamplingParams]]:
    """n prompts of 36..43 tokens; every fourth request seeded sampling, the rest greedy."""
    out = []
    for i in range(n):
        prompt = [int(t) for t in np.random.default_rng(i).integers(3, 320, 36 + i % 8)]
        kw = dict(temperature=0.8, seed=50 + i) if i % 4 == 3 else dict(temperature=0)
        out.append((prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True, **kw)))
    return out


def _generate(llm: LLM, requests) -> tuple[list[tuple[int, ...]], list]:
    """Run through the generator's loop, keeping its events in order to see who ran together."""
    states, loop = llm.generator.start([p for p, _ in requests], [s for _, s in requests])
    events = list(loop)
    return [tuple(r.token_ids) for r in states], events


def _all_ran_at_once(events, n: int) -> bool:
    """Every request's first token came before any request finished."""
    first = {}
    for i, e in enumerate(events):
        first.setdefault(e.request, i)
    finished = min(i for i, e in enumerate(events) if e.finished)
    return len(first) == n and max(first.values()) < finished


def _pool_llm(engine, blocks: int) -> LLM:
    probe = LLM(engine, kv_cache_memory=16 << 20)
    per_block = probe.backend.layout.bytes_per_block
    probe.close()
    llm = LLM(engine, kv_cache_memory=blocks * per_block)
    assert llm.backend.kv.pool.num_blocks == blocks
    return llm


def _no_leak(llm: LLM) -> None:
    kv, sched = llm.backend.kv, llm.generator.admission.scheduler
    assert kv.num_free == WIDE.max_batch
    assert sched.kv_stats().used_blocks == 0 and not sched.running and not sched.waiting
    if getattr(kv, "paged", False):  # every used block is a cached prefix only the tree holds
        assert not kv.blocks.sequences()
        assert kv.pool.num_used == kv.blocks.tree.stats().blocks
        assert all(kv.pool.refcount[path[-1]] == 1 for path in kv.blocks.tree.cached_paths())


def test_budget_of_four_full_sequences_runs_32_requests_at_once(engines, alone):
    slots, _ = engines
    requests = _requests(32, 64)  # ~100 tokens each with the answer: 7 blocks of 16
    llm = LLM(slots, prefix_cache=False, kv_budget_tokens=4 * WIDE.max_seq_len)
    try:
        assert llm.generator.admission.config.kv_budget_tokens == 4 * WIDE.max_seq_len
        outs, events = _generate(llm, requests)
        assert _all_ran_at_once(events, 32)
        assert outs == [alone(p, s) for p, s in requests]
        _no_leak(llm)
    finally:
        llm.close()


def test_paged_pool_of_four_full_sequences_runs_32_requests_at_once(engines, alone):
    _, paged = engines
    requests = _requests(32, 64)
    llm = _pool_llm(paged, 4 * WIDE.max_seq_len // BLOCK + 1)  # + the pool's scratch block
    try:
        outs, events = _generate(llm, requests)
        assert _all_ran_at_once(events, 32)
        assert outs == [alone(p, s) for p, s in requests]
        # the same call through LLM.generate: same tokens, the prompts' cached blocks mapped this time
        assert [o.token_ids for o in llm.generate(prompt_token_ids=[p for p, _ in requests],
                                                  params=[s for _, s in requests])] == outs
        _no_leak(llm)
    finally:
        llm.close()


def test_requests_that_do_not_fit_reserved_all_run_preempted_with_identical_tokens(engines, alone):
    _, paged = engines
    requests = _requests(12, 120)  # 156..163 tokens: 10..11 blocks each, ~125 reserved
    llm = _pool_llm(paged, WIDE.max_seq_len // BLOCK + 1)  # the smallest pool: one full sequence (64 blocks)
    try:
        # together they need far more blocks than the pool holds (the retired admission by free slots, reserving
        # prompt + max_new_tokens each, raised CapacityError here)
        assert sum(-(-(len(p) + s.max_new_tokens) // BLOCK) for p, s in requests) > WIDE.max_seq_len // BLOCK
        admission = llm.generator.admission
        outs = [o.token_ids for o in llm.generate(prompt_token_ids=[p for p, _ in requests],
                                                   params=[s for _, s in requests])]
        assert admission.scheduler.resumes.preemptions > 0
        assert outs == [alone(p, s) for p, s in requests]
        _no_leak(llm)
    finally:
        llm.close()


def test_a_closed_stream_gives_its_slot_and_blocks_back(engines):
    _, paged = engines
    llm = _pool_llm(paged, WIDE.max_seq_len // BLOCK + 1)
    try:
        stream = llm.stream("w5 w6 w7", SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=0))
        next(stream)
        assert llm.generator.admission.scheduler.kv_stats().used_blocks > 0
        stream.close()
        _no_leak(llm)
    finally:
        llm.close()


def test_a_request_larger_than_the_budget_is_refused_before_any_work(engines):
    slots, _ = engines
    with pytest.raises(ConfigError, match="kv_budget_tokens"):
        LLM(slots, kv_budget_tokens=0)
    llm = LLM(slots, prefix_cache=False, kv_budget_tokens=96)  # 6 blocks of 16
    try:
        (prompt, params), = _requests(1, 60)  # 36 + 60 tokens: 6 blocks, fits
        fits = llm.generate(prompt_token_ids=[prompt], params=params)[0]
        assert len(fits.token_ids) == 60
        with pytest.raises(InputError, match="KV budget holds 6"):  # 36 + 61: 7 blocks, never fits
            llm.generate(prompt_token_ids=[prompt, prompt],
                         params=[params, SamplingParams(max_new_tokens=61, temperature=0)])
        assert llm.backend.kv.num_free == WIDE.max_batch  # refused before the first request started
    finally:
        llm.close()
