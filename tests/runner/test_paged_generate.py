"""LLM on a paged engine (`build --kv-layout paged`): the generation loop over the block pool.

The reference is the slot-layout engine of the same tiny model (tiny_serve_engine): same tokens for
ragged batches with continuous refill, beam search (forked blocks), prefix hits (mapped by reference) and
a pool so small that cached prefixes are evicted.
"""

from __future__ import annotations

import numpy as np
import pytest
from runner_engines import build_paged_engine

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.runner.ort_paged import PagedOrtBackend

BLOCK = 4


@pytest.fixture(scope="module")
def paged_engine(tiny_serve_engine, module_tmp_factory):
    """tiny_serve_engine's model, tokenizer and limits, built paged (its checkpoint sits next to it)."""
    out = module_tmp_factory.mktemp("paged") / "engine"
    ckpt = tiny_serve_engine.parent / "ckpt"
    lim = LLM(tiny_serve_engine).engine.limits
    return build_paged_engine(ckpt, out, Limits(lim.max_batch, lim.max_input_len, lim.max_seq_len), BLOCK)


def words(n: int, seed: int) -> str:
    """n tokens of text ("w3".."w9": one token per word under the tiny word tokenizer)."""
    return " ".join(f"w{i}" for i in np.random.default_rng(seed).integers(3, 10, n))


# the third starts with the first's 24 tokens (6 blocks), then 6 of its own
PROMPTS = [words(30, 0), words(7, 1), " ".join(words(30, 0).split()[:24]) + " w3 w3 w3 w3 w4 w4", words(9, 3),
           words(12, 4)]


def tokens(llm, prompts, **kw) -> list[tuple[int, ...]]:
    return [tuple(o.token_ids) for o in llm.generate(prompts, SamplingParams(max_new_tokens=12, **kw))]


@pytest.fixture(scope="module")
def slot_tokens(tiny_serve_engine):
    llm = LLM(tiny_serve_engine)
    return tokens(llm, PROMPTS), tokens(llm, PROMPTS[:2], num_beams=2)


def test_paged_generation_equals_slots_with_and_without_prefix_cache(paged_engine, slot_tokens):
    for prefix_cache in (False, True):
        llm = LLM(paged_engine, prefix_cache=prefix_cache)
        assert isinstance(llm.backend, PagedOrtBackend)
        assert tokens(llm, PROMPTS) == slot_tokens[0]  # 5 prompts over 2 slots: refill as slots free
        assert tokens(llm, PROMPTS[:2], num_beams=2) == slot_tokens[1]  # beams fork blocks
        assert tokens(llm, PROMPTS) == slot_tokens[0]  # again: the second round hits every cached prefix
        kv = llm.backend.kv
        cached = kv.blocks.tree.stats().blocks if prefix_cache else 0
        assert kv.pool.num_used == cached  # every request's blocks came back; only the tree's remain
        assert kv.num_free == kv.batch_slots


def test_prefix_hit_maps_cached_blocks_and_prefills_the_rest(paged_engine, slot_tokens):
    llm = LLM(paged_engine, prefix_cache=True)
    cache, tree = llm.generator.prefix_cache, llm.backend.kv.blocks.tree
    assert tokens(llm, PROMPTS[:1]) == slot_tokens[0][:1]
    first = cache.stats()
    assert (first.hit_tokens, first.blocks) == (0, 30 // BLOCK)  # a miss; the prompt's 7 full blocks stay
    paths = set(tree.cached_paths())
    assert tokens(llm, PROMPTS[2:3]) == slot_tokens[0][2:3]  # starts with the first prompt's 24 tokens
    second = cache.stats()
    assert second.hit_tokens == 24  # 6 blocks mapped, 6 tokens prefilled
    # the 6 shared blocks are the same tree nodes: only the new 7th block was added
    assert paths <= set(tree.cached_paths()) and second.blocks == first.blocks + 1
    assert tokens(llm, PROMPTS[3:4]) == slot_tokens[0][3:4] and cache.stats().hit_tokens == 24  # a miss


def test_small_pool_evicts_cached_prefixes_and_still_matches(paged_engine, slot_tokens):
    engine_layout = LLM(paged_engine).engine.twin_paged_layout
    per_seq = engine_layout.max_blocks_per_seq
    llm = LLM(paged_engine, prefix_cache=True, kv_cache_memory=(per_seq + 1) * engine_layout.bytes_per_block)
    assert llm.backend.kv.pool.num_blocks == per_seq + 1  # one full sequence: the least a pool may hold
    assert tokens(llm, PROMPTS) == slot_tokens[0]
    assert tokens(llm, PROMPTS) == slot_tokens[0]
    assert llm.backend.kv.blocks.tree.stats().evicted_blocks > 0
