"""Optimistic admission and preemption when KV blocks run out (runner/scheduling/kv_growth.py), on real engines.

Requests enter holding the blocks of their prompt only and grow block by block as they decode; a budget
(slot layout: the scheduler's bookkeeping) or a block pool (paged layout: the real storage) too small for
every sequence's full length runs out mid-decode, and the least urgent, newest request is preempted by
recompute. Every answer must equal the same request run alone (greedy and seeded sampling), the
preemption counter of /metrics must move, and nothing may leak: no budget block, no slot, no pool block
but the prefix cache's own.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from runner_engines import build_engine, build_paged_engine

from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.formats.build_config import Limits
from engine_builder.server.metrics import _kv_metrics

LIMITS = Limits(max_batch=8, max_input_len=64, max_seq_len=160)
POOL_BLOCK = 8  # the paged engine's block: not the scheduler's 16, so the pool binds on its own


@pytest.fixture(scope="module")
def engines(tiny_serve_engine, module_tmp_factory):
    root, ckpt = module_tmp_factory.mktemp("kv-growth"), tiny_serve_engine.parent / "ckpt"
    slots = build_engine(ckpt, root / "slots", LIMITS)
    return slots, build_paged_engine(ckpt, root / "paged", LIMITS, POOL_BLOCK)


def _requests() -> list[tuple[list[int], SamplingParams]]:
    """12 requests of 20..40 prompt tokens + 60 new ones (5..7 blocks of 16 each at the end); every third seeded."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(12):
        prompt = [int(t) for t in rng.integers(3, 320, 20 + (7 * i) % 21)]
        kw = dict(temperature=0.8, seed=100 + i) if i % 3 == 2 else dict(temperature=0)
        out.append((prompt, SamplingParams(max_new_tokens=60, ignore_eos=True, **kw)))
    return out


def _alone(engine) -> list[tuple[int, ...]]:
    llm = LLM(engine, prefix_cache=False)
    try:
        return [llm.generate(prompt_token_ids=[p], params=s)[0].token_ids for p, s in _requests()]
    finally:
        llm.close()


def _run(llm: LLM, config: SchedulerConfig) -> tuple[list[tuple[int, ...]], Executor]:
    with Executor(llm, config) as executor:
        handles = [executor.submit(p, s) for p, s in _requests()]
        outs = [tuple(h.result(timeout=300).token_ids) for h in handles]
    assert all(len(h.token_times) == 60 for h in handles)  # nothing streamed twice after a resume
    return outs, executor


def _preemptions(executor: Executor) -> float:
    (family,) = [m for m in _kv_metrics(executor.stats()) if m.name == "trtbuild_preemptions"]
    return family.samples[0].value


def test_slot_engine_budget_runs_out_preempts_and_answers_stay_exact(engines):
    slots, _ = engines
    want = _alone(slots)
    llm = LLM(slots, prefix_cache=False)
    # 20 blocks of 16: ~3 full sequences; admission by prompt lets ~6 in, so their growth runs out
    outs, executor = _run(llm, SchedulerConfig(kv_budget_tokens=20 * 16, max_tokens_per_step=64))
    assert _preemptions(executor) > 0
    stats = executor.stats()
    assert (stats.kv_blocks_used, stats.running, stats.queue_depth) == (0, 0, 0)
    assert llm.backend.kv.num_free == LIMITS.max_batch
    assert outs == [tuple(t) for t in want]
    llm.close()


def test_paged_engine_pool_runs_out_preempts_and_answers_stay_exact(engines):
    slots, paged = engines
    want = _alone(slots)  # the slot engine alone: the paged one under pressure must give the same tokens
    layout = LLM(paged).backend.layout
    llm = LLM(paged, kv_cache_memory=40 * layout.bytes_per_block)  # 39 blocks of 8 + scratch: ~3 full sequences
    kv = llm.backend.kv
    assert kv.pool.num_blocks == 40
    outs, executor = _run(llm, SchedulerConfig(max_tokens_per_step=64))  # the budget is large: the pool binds
    assert _preemptions(executor) > 0
    assert outs == [tuple(t) for t in want]
    # no leak: every slot free, and every used block is a cached prefix only the tree holds
    assert kv.num_free == LIMITS.max_batch and not kv.blocks.sequences()
    tree = kv.blocks.tree
    assert kv.pool.num_used == tree.stats().blocks
    assert all(kv.pool.refcount[path[-1]] == 1 for path in tree.cached_paths())
    tree.clear()
    assert kv.pool.num_used == 0
    llm.close()


def test_cancels_among_preemptions_leak_nothing(engines):
    slots, paged = engines
    want = _alone(slots)
    layout = LLM(paged).backend.layout
    llm = LLM(paged, kv_cache_memory=40 * layout.bytes_per_block)
    kv = llm.backend.kv
    with Executor(llm, SchedulerConfig(max_tokens_per_step=64)) as executor:
        # requests 1, 5, 9 are cancelled after their 5th token (running, waiting or preempted then); 100 new
        # tokens each, so they are far from done when the cancel lands; their first 60 are the 60-token answer's
        handles = [executor.submit(p, dataclasses.replace(s, max_new_tokens=100) if i % 4 == 1 else s)
                   for i, (p, s) in enumerate(_requests())]
        cancelled = handles[1::4]
        for h in cancelled:
            for _ in h.events(timeout=120):
                if len(h.token_times) >= 5:
                    break
            h.cancel()
        outs = {h.id: h.result(timeout=300) for h in handles}
        assert _preemptions(executor) > 0
        assert executor.stats().kv_blocks_used == 0
    for i, h in enumerate(handles):
        if h in cancelled:
            assert outs[h.id].finish_reason == "cancelled"
            got = tuple(outs[h.id].token_ids)
            assert 5 <= len(got) < 100 and got[:60] == tuple(want[i][:len(got)])  # exact up to the cancel
        else:
            assert tuple(outs[h.id].token_ids) == tuple(want[i])
    assert kv.num_free == LIMITS.max_batch and not kv.blocks.sequences()
    assert kv.pool.num_used == kv.blocks.tree.stats().blocks  # only cached prefixes hold blocks
    llm.close()
