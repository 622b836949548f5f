"""What one step runs, decided before anything executes: the scheduler returns it, the step carries it out.

    plan = scheduler.schedule()          # KV grown or preempted, waiting requests admitted, chunks sized
    run_engine_step(scheduler, plan, prefills)

vLLM v1's SchedulerOutput and TensorRT-LLM's ScheduledRequests are the models: the loop reads which requests run
and how many tokens each feeds from here, not by asking the scheduler again mid-step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.runner.request_state import RequestState


@dataclass(frozen=True)
class StepPlan:
    preempted: tuple[RequestState, ...]  # sent back to waiting this step, their KV freed (recomputed when readmitted)
    admitted: tuple[RequestState, ...]  # took a slot this step (in admission order)
    prefill: tuple[tuple[RequestState, int], ...]  # (request, context tokens it feeds now): a chunk or the rest
    # one token each after the prefill calls, in admission order: the requests past their prefill and those whose
    # prefill ends in this step (the step skips one that finished or failed on the way)
    decode: tuple[RequestState, ...]

