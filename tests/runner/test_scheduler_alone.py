"""The scheduler plans over the KV interface alone (issue 32): no backend, no Generator, no engine dir.

A bare paged KV manager (bookkeeping only) stands where an engine's cache would be, and the test plays the
step loop's part itself: each planned prefill chunk writes its tokens, a finished prefill yields the first
token, each planned decode writes one position and yields one more, a request with all its tokens gives its
slot back. What the scheduler decides (admission by blocks, growth, preemption by urgency, which slots it
freed) is then checked against that bookkeeping.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.detokenizer import IncrementalDetokenizer
from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.runner.request_state import RequestState
from engine_builder.runner.sampler import SamplingState
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.scheduler import Scheduler, SchedulerConfig
from engine_builder.runner.stopping import StopChecker

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


def play(sched: Scheduler, kv: PagedKVCacheManager, arrivals: dict[int, list[RequestState]] | None = None,
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
