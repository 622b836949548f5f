"""Batched prefill on the paged KV layout (runner/batched_prefill.py), SmolLM2 fp32 built `--kv-layout paged`.

The paged graph runs one attention op for every call (Attention-24 in the twin, no branch on batch or past
lengths), so a shared, right-padded call gives every row its solo call's logits bit for bit, rows starting past
0 (a prefix-cache hit) included; what the slot layout must keep alone shares a call here. Padding writes land in
blocks the row's table maps (its next blocks, or scratch), riders must be free slots, and a pool too short for
the padding's blocks makes the group prefill one by one. Tokens, greedy and seeded, equal each request alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from prefill_logits import claimed_requests, decode_to_end, shared_logits, solo_logits
from runner_engines import build_paged_engine

from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor
from engine_builder.runner.batched_prefill import fits, pool_has_room, prefill_together, start

# the last one is 17 tokens: its solo reference run caches its first block, so in a batch its row starts at 16
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "In the old harbour town, the fishermen gathered every morning before dawn to mend their nets"]
PARAMS = [SamplingParams(max_new_tokens=8, temperature=0),
          SamplingParams(max_new_tokens=10, temperature=1.0, seed=11),
          SamplingParams(max_new_tokens=9, temperature=0.8, top_k=40, seed=12),
          SamplingParams(max_new_tokens=7, temperature=1.3, top_p=0.9, repetition_penalty=1.3, seed=13)]
POOL = 64 << 20  # bytes: plenty for 4 x 256 positions


@pytest.fixture(scope="module")
def paged_engine(smollm2_ckpt):
    out = smollm2_ckpt.parent / "engine-paged"
    if not out.exists():
        build_paged_engine(smollm2_ckpt, out)
    return out


@pytest.fixture(scope="module")
def llm(paged_engine):
    llm = LLM(paged_engine, backend="onnxruntime", kv_cache_memory=POOL)
    yield llm
    llm.close()


def test_a_shared_paged_call_computes_each_rows_solo_logits_bit_for_bit(llm):
    backend = llm.backend
    prompts = [llm.encode(p) for p in PROMPTS]
    assert [len(p) for p in prompts] == [5, 6, 10, 17]
    for past in ([0, 0, 0, 0], [0, 3, 0, 16], [2, 0, 7, 11]):  # rows starting past 0 too
        solo, shared = solo_logits(backend, prompts, past), shared_logits(backend, prompts, past=past)
        assert all(np.array_equal(a, b) for a, b in zip(solo, shared)), past
    solo = solo_logits(backend, prompts[:3])
    for rider in (0, 9):
        assert all(np.array_equal(a, b) for a, b in zip(solo, shared_logits(backend, prompts[:3], rider)))


def test_a_prefix_hit_shares_the_call_and_every_token_equals_the_request_alone(llm):
    alone = [llm.generate(p, sp)[0].token_ids for p, sp in zip(PROMPTS, PARAMS)]  # caches the last one's block
    gen, kv = llm.generator, llm.backend.kv
    with claimed_requests(gen, [llm.encode(p) for p in PROMPTS], PARAMS) as requests:
        for r in requests:
            gen.admit(r, len(r.prompt_ids) + 1)  # slots 0..3, blocks for the prompt (the scheduler's way)
        r0, r1, r2, cached = requests
        group = [r0, r2, cached]
        starts = {r.slot: start(gen, r) for r in group}
        assert starts == {0: 0, 2: 0, 3: 16}  # a prefix hit: on the slot layout it would prefill alone
        lengths = [len(r.prompt_ids) - starts[r.slot] for r in group]
        assert not fits(gen, starts, lengths)  # slot 1 is admitted: it may not ride along (it would take blocks)
        gen.release(r1)
        assert fits(gen, starts, lengths)  # a free slot 1 rides along on its all-scratch table
        events: list = []
        fed = prefill_together(gen, group, events)
        assert fed == 4 * max(lengths)
        assert [kv.length(r.slot) for r in group] == [len(r.prompt_ids) for r in group]
        gen.admit(r1, len(r1.prompt_ids) + 1)
        gen.prefill(r1, events)
        decode_to_end(gen, requests, events)
    assert [tuple(r.token_ids) for r in requests] == [tuple(a) for a in alone]


def test_a_pool_short_of_the_paddings_blocks_prefills_the_group_one_by_one(llm, paged_engine):
    bytes_per_block = llm.backend.layout.bytes_per_block
    small = LLM(paged_engine, backend="onnxruntime", prefix_cache=False, kv_cache_memory=20 * bytes_per_block)
    ids = small.encode(PROMPTS[3] + ", and told stories of storms and whales to anyone who would listen")
    prompts = [ids[1:15], ids[:20]]  # 14 and 20 tokens: row 0 holds 1 block, its padding to 20 reaches a 2nd
    assert [len(p) for p in prompts] == [14, 20]
    alone = [small.generate(prompt_token_ids=[p], params=sp)[0].token_ids for p, sp in zip(prompts, PARAMS)]
    gen, kv = small.generator, small.backend.kv
    try:
        with claimed_requests(gen, prompts, PARAMS) as requests:
            for r in requests:
                gen.admit(r, len(r.prompt_ids) + 1)  # blocks for the prompt and its first token (the scheduler's way)
            starts, lengths = {0: 0, 1: 0}, [14, 20]
            assert kv.blocks_to_grow(0, 20) == 1 and fits(gen, starts, lengths)  # planned with the pool's room
            filler = kv.allocate("filler", 1, 255, kv.available_blocks() * kv.block_size)  # an earlier call took it
            try:
                assert kv.available_blocks() == 0 and not pool_has_room(gen, starts, 20)
                events: list = []
                fed = prefill_together(gen, requests, events)
                assert fed == 14 + 20  # one call each (a shared one would have fed 2 x 20), and no error
                assert [kv.length(r.slot) for r in requests] == lengths and len(events) == 2
            finally:
                kv.free(filler)
            decode_to_end(gen, requests, events)
    finally:
        small.close()
    assert [tuple(r.token_ids) for r in requests] == [tuple(a) for a in alone]


def test_prompts_arriving_together_share_paged_calls_through_the_executor(llm):
    alone = [llm.generate(p, sp)[0] for p, sp in zip(PROMPTS, PARAMS)]
    with Executor(llm) as executor:
        with executor._lock:  # all four are queued before the loop's next step takes any
            handles = [executor.submit(llm.encode(p), sp) for p, sp in zip(PROMPTS, PARAMS)]
        outs = [h.result(timeout=120) for h in handles]
        stats = executor.stats()
    assert [o.token_ids for o in outs] == [a.token_ids for a in alone]
    assert [o.text for o in outs] == [a.text for a in alone]
    assert stats.batched_prefill_calls >= 1 and stats.batched_prefill_requests >= 2
    kv = llm.backend.kv
    assert kv.num_free == kv.batch_slots and not kv.blocks.sequences()
