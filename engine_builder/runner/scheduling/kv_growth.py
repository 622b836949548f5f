"""Growing running requests' KV block by block, and preempting when blocks run out (vLLM's recompute policy).

    preempted = grow_or_preempt(running, shortfall=..., fits=..., grow=..., preempt=...)

Admission is optimistic (scheduler.py): a request enters holding the blocks of its context plus the next
step's tokens, not prompt + max_new_tokens, so a budget runs as many sequences as their actual lengths
allow. Before every step each running request must hold room for what that step writes (its next decode
token, or the rest of its prompt): the most urgent first (priority, then arrival: admission.order_key)
take the blocks they lack. When a request's blocks are not there (the KV budget's, asked through the KV
interface: for a paged engine its pool's, even after evicting cached prefixes nobody maps), the least urgent,
newest running request is preempted by recompute (preemption.py: it frees its slot and blocks and is requeued
with its generated tokens, which it later prefills again, producing exactly the tokens it would have), until the
request fits or is itself the one preempted. A request never needs more than the whole budget (Scheduler.check
refuses it at submit), so the most urgent one always fits once the others are gone: nothing deadlocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from engine_builder.runner.request_state import RequestState
from engine_builder.runner.scheduling.admission import order_key


def grow_or_preempt(running: Sequence[RequestState], *, shortfall: Callable[[RequestState], int],
                    fits: Callable[[int], bool], grow: Callable[[RequestState], None],
                    preempt: Callable[[RequestState], None]) -> list[RequestState]:
    """Give each running request the KV blocks it lacks (shortfall) for this step, most urgent first, preempting
    the least urgent ones while their need does not fit. Returns the preempted, in the order they were."""
    queue = deque(sorted(running, key=order_key))  # most urgent first: the last one is the cheapest to lose
    preempted: list[RequestState] = []
    while queue:
        need = shortfall(queue[0])
        if need <= 0:  # holds what this step writes (most decode steps): nothing to do
            queue.popleft()
            continue
        if fits(need):
            grow(queue.popleft())
            continue
        victim = queue.pop()  # may be queue[0] itself: then it waits for room in the queue
        preempt(victim)
        preempted.append(victim)
    return preempted
