"""Slot allocation, length tracking and over-capacity messages of the static KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.util.errors import CapacityError, InputError, TrtbuildError


def _cache(slots: int = 2, max_seq: int = 128, dtype="float16") -> KVCacheManager:
    return KVCacheManager(num_layers=3, batch_slots=slots, kv_heads=2, max_seq=max_seq, head_dim=8, dtype=dtype)


def test_buffers_are_allocated_once_with_graph_layout():
    cache = _cache()
    assert len(cache.keys) == len(cache.values) == 3
    ids_before = [id(a) for a in cache.keys + cache.values]
    for buf in cache.keys + cache.values:
        assert buf.shape == (2, 2, 128, 8) and buf.dtype == np.float16 and not buf.any()
    slot = cache.allocate("a", 10, 5)
    cache.free(slot)
    cache.allocate("b", 10, 5)
    assert [id(a) for a in cache.keys + cache.values] == ids_before
    assert cache.nbytes == 3 * 2 * (2 * 2 * 128 * 8) * 2


def test_allocate_lowest_free_slot_and_reuse_after_free():
    cache = _cache(slots=3)
    assert [cache.allocate(r, 4, 4) for r in "abc"] == [0, 1, 2]
    assert cache.num_free == 0 and cache.slot_of("b") == 1
    cache.free(1)
    assert cache.num_free == 1 and cache.slot_of("b") is None
    assert cache.allocate("d", 4, 4) == 1


def test_length_tracking_and_past_lengths_array():
    cache = _cache()
    a, b = cache.allocate("a", 10, 6), cache.allocate("b", 3, 2)
    assert cache.length(a) == 0 and cache.reserved(a) == 16
    cache.advance(a, 10)  # prefill
    cache.advance(a, 1)  # one decode step
    cache.advance(b, 3)
    assert (cache.length(a), cache.length(b)) == (11, 3)
    np.testing.assert_array_equal(cache.lengths, [11, 3])  # what the graph takes as past_lengths [batch]
    assert cache.lengths.dtype == np.int64
    with pytest.raises(ValueError, match="reserved 5"):
        cache.advance(b, 3)  # 6 > 3 + 2


def test_request_needing_more_than_max_seq_is_refused_with_what_to_do():
    cache = _cache(max_seq=128)
    with pytest.raises(CapacityError) as err:
        cache.allocate("req-1", 100, 30)
    message = str(err.value)
    assert isinstance(err.value, TrtbuildError)
    assert "needs 130 positions" in message and "engine max_seq_len is 128" in message
    assert "shorten the prompt or lower max_new_tokens" in message and "--max-seq-len" in message
    assert cache.num_free == 2  # nothing was taken
    assert cache.allocate("req-2", 100, 28) == 0  # exactly max_seq fits


def test_no_free_slot_is_refused_with_what_to_do():
    cache = _cache(slots=2)
    cache.allocate("a", 1, 1)
    cache.allocate("b", 1, 1)
    with pytest.raises(CapacityError, match="all 2 KV cache slots are in use.*wait for a running request to finish"):
        cache.allocate("c", 1, 1)


def test_bad_requests_and_misuse():
    cache = _cache()
    cache.allocate("a", 1, 1)
    with pytest.raises(InputError, match="already holds KV cache slot 0"):
        cache.allocate("a", 1, 1)
    with pytest.raises(InputError, match="empty prompt"):
        cache.allocate("b", 0, 1)
    with pytest.raises(InputError, match="max_new_tokens must be >= 1"):
        cache.allocate("b", 1, 0)
    cache.free(0)
    with pytest.raises(ValueError, match="not allocated"):
        cache.free(0)
    with pytest.raises(ValueError, match="out of range"):
        cache.length(5)
    with pytest.raises(InputError, match="batch_slots must be a positive integer"):
        KVCacheManager(1, 0, 1, 8, 8)


def test_free_zeroes_only_what_the_request_wrote():
    cache = _cache()
    a, b = cache.allocate("a", 4, 4), cache.allocate("b", 4, 4)
    for layer in range(3):
        cache.keys[layer][:, :, :6] = 1.0
        cache.values[layer][:, :, :6] = np.inf  # even a poisoned slot comes back clean
    cache.advance(a, 6)
    cache.advance(b, 6)
    cache.free(a)
    for layer in range(3):
        assert not cache.keys[layer][a].any() and not cache.values[layer][a].any()
        assert (cache.keys[layer][b, :, :6] == 1.0).all()  # the other request is untouched
    assert cache.lengths[a] == 0


def test_bfloat16_and_bad_dtype():
    assert _cache(dtype="bfloat16").keys[0].dtype.name == "bfloat16"
    assert _cache(dtype=np.float32).keys[0].dtype == np.float32
    with pytest.raises(InputError, match="not a numpy dtype"):
        _cache(dtype="floaty")
