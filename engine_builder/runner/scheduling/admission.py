"""Who gets into the running batch this step, and whom a more urgent request pushes out (preemption).

    plan = plan_admission(waiting, running, room, need=..., held=..., skips=..., max_overtakes=8)
    plan.admit, plan.preempt

Order: by priority (lower first, vLLM's convention), then arrival. A request is admitted when a row
(a KV slot under max_batch) and the KV blocks it needs now (its context + the next step's tokens:
optimistic, it grows later, kv_growth.py) are free in the KV budget (the KV cache's: runner/kv/block_budget.py)
beyond a watermark kept for the running requests' growth. When it does not fit:

  preemption   if running requests of strictly lower priority (a higher value) would free enough,
               the least urgent and newest of them are preempted by recompute (preemption.py): they
               go back to the queue and later recompute their KV, producing exactly the tokens they
               would have. Equal priorities never preempt each other, so nothing thrashes.
  fair share   otherwise smaller requests behind it may overtake it (a long request waiting for
               room must not idle the blocks that short ones could use), but only max_overtakes
               times: after that nobody behind it is admitted until it fits, so a long request is
               delayed by at most that many short ones, never starved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine_builder.runner.request_state import RequestState


@dataclass(frozen=True)
class Room:
    rows: int  # KV slots free for new sequences (max_batch - running, and slots actually free)
    blocks: int  # KV budget blocks free (KVCache.available_blocks)


@dataclass(frozen=True)
class AdmissionPlan:
    admit: tuple[RequestState, ...]
    preempt: tuple[RequestState, ...]


def order_key(r: RequestState) -> tuple[int, int]:
    """Scheduling order: priority, then arrival (request ids grow with arrival; a preempted request keeps its id)."""
    return r.params.priority, r.index


def plan_admission(waiting: Sequence[RequestState], running: Sequence[RequestState], room: Room, *,
                   need: Callable[[RequestState], int], held: Callable[[RequestState], int],
                   skips: dict[int, int], max_overtakes: int, preempt: bool = True,
                   preemptible: Callable[[RequestState], bool] = lambda r: True, watermark: int = 0,
                   width: Callable[[RequestState], int] = lambda r: 1) -> AdmissionPlan:
    """The requests to admit and to preempt now. skips (request id -> times overtaken) is updated in place.
    watermark: blocks kept free for the running requests' growth once anything runs (optimistic admission:
    kv_growth.py); a request alone may take them all, so one that fits the budget always runs. width: the rows
    (KV slots) a request takes: one, or one per beam."""
    rows, blocks = room.rows, room.blocks
    admit: list[RequestState] = []
    evict: list[RequestState] = []
    # least urgent first, newest first among equals: the ones whose loss costs the least
    victims = sorted((r for r in running if preemptible(r)), key=lambda r: (-r.params.priority, -r.index))
    passed_over: list[RequestState] = []
    for r in sorted(waiting, key=order_key):
        n = need(r)
        keep = watermark if (running or admit) else 0
        if rows >= width(r) and blocks - keep >= n:
            admit.append(r)
            rows, blocks = rows - width(r), blocks - n
            for b in passed_over:
                skips[b.index] = skips.get(b.index, 0) + 1
            continue
        if preempt:
            take, free_rows, free_blocks = [], rows, blocks
            for v in victims:
                if free_rows >= width(r) and free_blocks >= n:
                    break
                if v.params.priority > r.params.priority and v not in evict:
                    take.append(v)
                    free_rows, free_blocks = free_rows + width(v), free_blocks + held(v)
            if take and free_rows >= width(r) and free_blocks >= n:
                evict += take
                admit.append(r)
                rows, blocks = free_rows - width(r), free_blocks - n
                continue
        if skips.get(r.index, 0) >= max_overtakes:
            break  # overtaken often enough: those behind it wait until it fits
        passed_over.append(r)
    return AdmissionPlan(tuple(admit), tuple(evict))
