"""The scheduler plans over the KV interface alone (issue 32): no backend, no Generator, no engine dir.

A bare KV manager (bookkeeping only: paged, or slots) stands where an engine's cache would be, and the test plays the
step loop's part itself: each planned prefill chunk writes its tokens, a finished prefill yields the first
token, each planned decode writes one position and yields one more, a request with all its tokens gives its
slot back. What the scheduler decides (admission by blocks, growth, preemption by urgency, which slots it
freed) is then checked against that bookkeeping.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.detokenizer import IncrementalDetokenizer
from engine_builder.runner.kv.block_budget import KVBudgetStats
from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.runner.request_state import RequestState
from engine_builder.runner.sampler import SamplingState
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.scheduler import Scheduler, SchedulerConfig
from engine_builder.runner.stopping import StopChecker
from engine_builder.util.errors import InputError

VOCAB = 64
LAYOUT = PagedKVLayout(num_layers=1, kv_heads=1, block_size=4, head_dim=2, dtype="float32", max_seq=64)
TOKENIZER = Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))


def request(index: int, prompt_len: int, new_tokens: int, priority: int = 0) -> RequestState:
    prompt = [1 + (index * 7 + i) % (VOCAB - 1) for i in range(prompt_len)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True, priority=priority)
    return RequestState(index, prompt, params, SamplingState(params, prompt, VOCAB),
                        StopChecker(params, IncrementalDetokenizer(TOKENIZER, prompt)))


def paged_kv(blocks: int, slots: int = 4) -> PagedKVCacheManager:
    return PagedKVCacheManager(LAYOUT, slots, BlockPool(LAYOUT, blocks, host_buffers=False), prefix_cache=False)


def play(sched: Scheduler, kv: KVCache, arrivals: dict[int, list[RequestState]] | None = None,
         max_steps: int = 500) -> list[int]:
    """Run the plans as a step loop would, checking each one; the order requests finished in."""
    arrivals, done = dict(arrivals or {}), []
    for step in range(max_steps):
        sched.waiting.extend(arrivals.pop(step, []))
        if not (sched.waiting or sched.running or arrivals):
            return done
        held = {r.index: [(s, kv.length(s)) for s in r.slots] for r in sched.running.values()}
        plan = sched.schedule()
        # what it freed is exactly what the preempted held, with the positions each had written
        assert list(plan.freed) == [pair for r in plan.preempted for pair in held[r.index]]
        assert all(r.slot is None and r.index not in sched.running for r in plan.preempted)
        for r, n in plan.prefill:
            kv.advance(r.slot, n)
            if sched.resumes.prefill_left(r) == 0:
                r.token_ids.append(1)  # the prefill's logits give the first token
        for r in plan.decode:
            if not r.finished and len(r.token_ids) < r.params.max_new_tokens:
                kv.advance(r.slot, 1)  # the last token's KV written
                r.token_ids.append(1)
        for r in list(sched.running.values()):
            if len(r.token_ids) == r.params.max_new_tokens:
                r.finish_reason = "length"
                r.give_back(kv)
                done.append(r.index)
        sched.retire_finished()
    raise AssertionError(f"not done after {max_steps} steps")


def test_a_pool_too_small_for_all_preempts_the_newest_and_everyone_finishes():
    kv = paged_kv(blocks=12)  # 11 usable blocks of 4 positions; four requests of 8 + 16 need 24 each
    free_at_start = kv.available_blocks()
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=64), kv, max_input_len=32)
    requests = [request(i, 8, 16) for i in range(4)]
    done = play(sched, kv, {0: requests})
    assert sorted(done) == [0, 1, 2, 3] and all(len(r.token_ids) == 16 for r in requests)
    assert sched.resumes.preemptions > 0
    assert done[0] == 0  # the oldest is never the one preempted
    assert kv.available_blocks() == free_at_start and kv.num_free == 4  # every slot and block given back


def test_a_more_urgent_arrival_preempts_a_running_request_and_finishes_first():
    kv = paged_kv(blocks=12, slots=2)
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=64), kv, max_input_len=32)
    background = [request(0, 8, 24, priority=1), request(1, 8, 24, priority=1)]
    urgent = request(2, 8, 4, priority=0)
    done = play(sched, kv, {0: background, 3: [urgent]})
    assert done[0] == 2 and sched.resumes.preemptions >= 1
    assert all(len(r.token_ids) == r.params.max_new_tokens for r in [*background, urgent])


def test_a_plan_is_made_before_anything_is_written():
    """schedule() admits and sizes the chunks; the written positions are the loop's (none until it runs)."""
    kv = paged_kv(blocks=40)
    sched = Scheduler(SchedulerConfig(max_tokens_per_step=16), kv, max_input_len=32)
    short, long = request(0, 10, 4), request(1, 40, 4)
    sched.waiting.extend([short, long])
    plan = sched.schedule()
    assert plan.admitted == (short, long) and plan.preempted == () and plan.freed == ()
    assert plan.prefill == ((short, 10), (long, 22))  # nothing decodes: one engine call's worth, shared
    assert (kv.length(short.slot), kv.length(long.slot)) == (0, 0)
    assert kv.blocks_to_grow(short.slot, 11) == 0  # its prompt and next token's blocks are held already


def slot_kv(slots: int = 4) -> KVCacheManager:
    return KVCacheManager(1, slots, 1, LAYOUT.max_seq, 2, "float32", host_buffers=False)


def test_over_a_slot_cache_its_budget_is_the_one_the_scheduler_asks():
    """A slot engine's rows are whole, yet the KV budget (a pool of counts the slot cache keeps) bounds the batch
    and runs out as a paged pool does: 4 requests of 8 + 16 positions (2 blocks of 16 each) through 4 blocks."""
    kv = slot_kv()
    sched = Scheduler(SchedulerConfig(kv_budget_tokens=4 * 16, max_tokens_per_step=64), kv, max_input_len=32)
    assert sched.kv_stats() == KVBudgetStats(16, 4, 0)
    requests = [request(i, 8, 16) for i in range(4)]
    sched.waiting.extend(requests)
    plan = sched.schedule()
    assert plan.admitted == tuple(requests[:3])  # 1 block each, the 1-block watermark kept for their growth
    assert kv.budget.blocks == 4 and sched.kv_stats().used_blocks == 3 == kv.used_blocks()
    done = play(sched, kv)
    assert sorted(done) == [0, 1, 2, 3] and all(len(r.token_ids) == 16 for r in requests)
    assert sched.resumes.preemptions > 0 and done[0] == 0
    assert kv.used_blocks() == 0 and kv.available_blocks() == 4 and kv.num_free == 4


def test_a_request_larger_than_the_budget_is_refused_whichever_the_layout():
    for kv in (slot_kv(), paged_kv(blocks=40)):
        sched = Scheduler(SchedulerConfig(kv_budget_tokens=32), kv, max_input_len=32)
        blocks, size = sched.budget.blocks, sched.budget.block_tokens
        assert blocks * size == 32  # 2 blocks of 16 (slot), 8 of the pool's 4 (paged: capped from 39)
        sched.check(list(range(1, 9)), SamplingParams(max_new_tokens=24))
        with pytest.raises(InputError, match=f"KV budget holds {blocks} \\(32 tokens\\)"):
            sched.check(list(range(1, 9)), SamplingParams(max_new_tokens=25))


def test_a_paged_pool_larger_than_the_budget_is_capped_while_the_scheduler_plans():
    kv = paged_kv(blocks=40)
    sched = Scheduler(SchedulerConfig(kv_budget_tokens=12 * 4, max_tokens_per_step=64), kv, max_input_len=32)
    assert kv.available_blocks() == 39  # nothing taken until it plans (LLM.generate's check makes a scheduler)
    requests = [request(i, 8, 16) for i in range(4)]  # 6 blocks each in the end: 24 > 12
    done = play(sched, kv, {0: requests})
    assert kv.budget.blocks == 12 and sched.resumes.preemptions > 0
    assert sorted(done) == [0, 1, 2, 3] and all(len(r.token_ids) == 16 for r in requests)
    Scheduler(SchedulerConfig(), kv, max_input_len=32).schedule()  # a scheduler without a budget: the whole pool
    assert kv.available_blocks() == 39
