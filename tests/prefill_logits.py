"""Each prompt's last-position logits from its own prefill call and from one shared, right-padded call: what
tests/executor/test_prefill_batching.py asserts equal and benchmarks/prefill_branch_numerics.py measures."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def solo_logits(backend, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """[vocab] logits of each prompt prefilled alone in a slot of its own."""
    out = []
    for ids in prompts:
        slot = backend.kv.allocate("solo", len(ids), 1)
        out.append(backend.step(slot, np.asarray(ids, np.int64)[None]).copy()[0])
        backend.release(slot)
    return out


def shared_logits(backend, prompts: Sequence[Sequence[int]], rider_length: int | None = None) -> list[np.ndarray]:
    """[vocab] logits of each prompt's last real position in one call over adjacent slots, rows right-padded
    with token 0; rider_length: one more slot after them holding that many positions rides along."""
    kv, width = backend.kv, max(map(len, prompts))
    rows = len(prompts) + (rider_length is not None)
    slots = [kv.allocate(i, width + (rider_length or 0), 1) for i in range(rows)]
    try:
        if rider_length is not None:
            kv.advance(slots[-1], rider_length)
        ids = np.zeros((rows, width), np.int64)
        for i, p in enumerate(prompts):
            ids[i, :len(p)] = p
        backend.bind(slots[0], ids)
        backend.execute()
        tail = backend.read_tail_logits()
        return [tail[i, tail.shape[1] - 1 - (width - len(p))].copy() for i, p in enumerate(prompts)]
    finally:
        for s in slots:
            backend.release(s)
