"""Prefix reuse (runner/kv/prefix_cache.py): a request that starts like an earlier one copies the cached KV
blocks into its slot and prefills only the rest, and answers exactly as without the cache."""

from __future__ import annotations

import numpy as np
import pytest

from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor, SchedulerConfig
from engine_builder.formats.build_config import Limits
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.kv.prefix_cache import PrefixCache

LIMITS = Limits(max_batch=4, max_input_len=64, max_seq_len=128)
GREEDY = SamplingParams(max_new_tokens=12, temperature=0, logprobs=1)


def _prompts() -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(0)
    shared = [int(t) for t in rng.integers(5, 300, 40)]  # 2 full blocks of 16, and 8 more
    return shared + [11, 12, 13, 14, 15], shared[:37] + [21, 22, 23, 24, 25, 26, 27]


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: sliding-window layers read cached blocks too
def test_cached_prefixes_give_the_same_tokens_and_logprobs(tiny_engine, arch):
    engine, _ = tiny_engine(arch, limits=LIMITS)
    a, b = _prompts()
    plain = LLM(engine, prefix_cache=False)
    want = [plain.generate(prompt_token_ids=[p], params=GREEDY)[0] for p in (a, b, a)]
    cached = LLM(engine, prefix_cache=True)
    got = [cached.generate(prompt_token_ids=[p], params=GREEDY)[0] for p in (a, b, a)]
    stats = cached.generator.prefix_cache.stats()
    # a stores 3 blocks (45 prompt + 12 answer tokens); b reuses the first 2 (its first 37 tokens match) and adds
    # its third; a again reuses 2 and leaves 13 to prefill (its third block holds answer tokens)
    assert stats.blocks == 4 and stats.hit_tokens == 64
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose([lp.logprob for lp in g.logprobs], [lp.logprob for lp in w.logprobs], atol=1e-4)


def test_the_executor_reuses_prefixes_under_chunked_prefill(tiny_engine):
    engine, _ = tiny_engine("llama", limits=LIMITS)
    a, b = _prompts()
    want = LLM(engine).generate(prompt_token_ids=[a, b], params=GREEDY)
    llm = LLM(engine, prefix_cache=True)
    with Executor(llm, SchedulerConfig(max_tokens_per_step=8)) as executor:
        first = executor.submit(a, GREEDY).result()  # stores a's blocks once its prompt is in
        second = executor.submit(b, GREEDY).result()
    assert (first.token_ids, second.token_ids) == (want[0].token_ids, want[1].token_ids)
    assert llm.generator.prefix_cache.stats().hit_tokens == 32


def _kv(slots: int = 3) -> KVCacheManager:
    return KVCacheManager(num_layers=2, batch_slots=slots, kv_heads=1, max_seq=64, head_dim=2, dtype="float32")


def _fill(kv: KVCacheManager, slot: int, tokens: list[int]) -> None:
    """Slot rows that say which token and layer wrote them, as if a prefill had run."""
    kv.allocate(("fill", slot), len(tokens), 1)
    for layer in range(kv.num_layers):
        kv.keys[layer][slot, 0, :len(tokens), 0] = np.asarray(tokens) + 1000 * layer
        kv.values[layer][slot, 0, :len(tokens), 1] = -np.asarray(tokens)
    kv.advance(slot, len(tokens))


def test_load_copies_whole_blocks_and_leaves_a_token_to_prefill():
    kv = _kv()
    cache = PrefixCache(kv, block_size=4)
    prompt = list(range(1, 11))  # 10 tokens: 2 full blocks
    _fill(kv, 0, prompt)
    cache.store(prompt, 0)
    assert cache.stats().blocks == 2
    kv.allocate("b", 10, 1)
    assert cache.load(prompt, 1) == 8 and kv.length(1) == 8
    for layer in range(2):
        np.testing.assert_array_equal(kv.keys[layer][1, 0, :8, 0], np.arange(1, 9) + 1000 * layer)
        np.testing.assert_array_equal(kv.values[layer][1, 0, :8, 1], -np.arange(1, 9))
    kv.allocate("c", 8, 1)
    assert cache.load(list(range(1, 9)), 2) == 4  # 8 tokens: the second block would leave nothing to prefill
    kv.free(2)
    kv.allocate("d", 8, 1)
    assert cache.load([1, 2, 3, 99, 5, 6, 7, 8], 2) == 0  # the first block differs


def test_least_recently_used_leaves_go_first_and_a_path_in_use_stays():
    kv = _kv()
    block_bytes = 2 * 2 * 1 * 4 * 2 * 4  # keys + values, [layers, kv_heads, block, head_dim] float32
    cache = PrefixCache(kv, block_size=4, budget_bytes=3 * block_bytes)
    first, second = [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 50, 60, 70, 80, 90]
    _fill(kv, 0, first)
    cache.store(first, 0)  # blocks (1..4), (5..8)
    _fill(kv, 1, second)
    cache.store(second, 1)  # shares (1..4); adds (50..80): 3 blocks, the budget
    kv.free(0)
    kv.allocate("again", 9, 1)
    assert cache.load(first, 0) == 8  # (5..8) is now the most recently used leaf
    third = [1, 2, 3, 4, 7, 7, 7, 7, 7]
    kv.free(1)
    _fill(kv, 1, third)
    assert cache.stats().evicted_blocks == 0
    cache.store(third, 1)  # evicts (50..80), the least recently used leaf; never (1..4), its parent
    assert cache.stats().blocks == 3 and cache.stats().evicted_blocks == 1  # /metrics trtbuild_prefix_cache_evictions
    kv.allocate("x", 9, 1)
    assert cache.load(second, 2) == 4  # (1..4) only: (50..80) is gone


def test_smollm2_chat_turns_sharing_a_system_prompt_answer_as_without_the_cache(smollm2_engine, smollm2_llm):
    system = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence, and "
                                           "never add a greeting, an apology or a follow-up question."}
    turns = ["What is the capital of France?", "What is the capital of Italy?", "Name a large ocean."]
    cached = LLM(smollm2_engine, prefix_cache=True)
    for question in turns:
        ids = smollm2_llm.encode_chat([system, {"role": "user", "content": question}])
        params = SamplingParams(max_new_tokens=16, temperature=0, logprobs=1)
        want = smollm2_llm.generate(prompt_token_ids=[ids], params=params)[0]
        got = cached.generate(prompt_token_ids=[ids], params=params)[0]
        assert got.token_ids == want.token_ids, question
        np.testing.assert_allclose([lp.logprob for lp in got.logprobs], [lp.logprob for lp in want.logprobs],
                                   atol=1e-4)
    assert cached.generator.prefix_cache.stats().hit_tokens >= 2 * 32  # the system prompt's blocks, twice
