"""Each prompt's last-position logits from its own prefill call and from one shared, right-padded call: what
tests/executor/test_prefill_batching.py (and test_paged_prefill_batching.py) assert equal and
benchmarks/prefill_branch_numerics.py measures; and the claimed generator those tests drive by hand."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np


def _prefill_past(backend, slot: int, ids: Sequence[int], past: int) -> None:
    """The prompt's first `past` tokens into the slot, in a call of their own (a row that starts past 0)."""
    if past:
        backend.step(slot, np.asarray(ids[:past], np.int64)[None])
        backend.kv.advance(slot, past)


def solo_logits(backend, prompts: Sequence[Sequence[int]], past: Sequence[int] | None = None) -> list[np.ndarray]:
    """[vocab] logits of each prompt prefilled alone in a slot of its own (after its first past[i] tokens)."""
    out = []
    for i, ids in enumerate(prompts):
        at = past[i] if past else 0
        slot = backend.kv.allocate("solo", len(ids), 1)
        _prefill_past(backend, slot, ids, at)
        out.append(backend.step(slot, np.asarray(ids[at:], np.int64)[None]).copy()[0])
        backend.release(slot)
    return out


def shared_logits(backend, prompts: Sequence[Sequence[int]], rider_length: int | None = None,
                  past: Sequence[int] | None = None) -> list[np.ndarray]:
    """[vocab] logits of each prompt's last real position in one call over adjacent slots, rows right-padded
    with token 0; rider_length: one more slot after them holding that many positions rides along; past: row i
    starts at past[i] (those tokens prefilled first, each in its own call)."""
    kv, past = backend.kv, list(past or [0] * len(prompts))
    width = max(len(p) - at for p, at in zip(prompts, past))
    rows = len(prompts) + (rider_length is not None)
    slots = [kv.allocate(i, max(map(len, prompts)) + width + (rider_length or 0), 1) for i in range(rows)]
    try:
        if rider_length is not None:
            kv.advance(slots[-1], rider_length)
        for slot, p, at in zip(slots, prompts, past):
            _prefill_past(backend, slot, p, at)
        ids = np.zeros((rows, width), np.int64)
        for i, (p, at) in enumerate(zip(prompts, past)):
            ids[i, :len(p) - at] = p[at:]
        backend.bind(slots[0], ids)
        backend.execute()
        tail = backend.read_tail_logits()
        last = tail.shape[1] - 1
        return [tail[i, last - (width - (len(p) - at))].copy() for i, (p, at) in enumerate(zip(prompts, past))]
    finally:
        for s in slots:
            backend.release(s)


@contextmanager
def claimed_requests(gen, prompts: Sequence[Sequence[int]], params: Sequence) -> Iterator[list]:
    """New requests on a generator claimed for the test; every slot given back and the claim dropped after."""
    gen.claim("test", "wait for the test")
    requests = [gen.new_request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
    try:
        yield requests
    finally:
        for r in requests:
            if r.slot is not None:
                gen.release(r)
        gen.unclaim()


def decode_to_end(gen, requests: Sequence, events: list) -> None:
    active = {r.slot: r for r in requests}
    while active:
        gen.decode(active, events)
