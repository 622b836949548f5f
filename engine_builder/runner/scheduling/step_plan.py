"""What one step runs, decided before anything executes: the scheduler returns it, the step carries it out.

    plan = next_plan(scheduler, generator)   # engine_step.py: schedule, then what the plan asks of the loop
    run_engine_step(scheduler, generator, plan, prefills)

vLLM v1's SchedulerOutput and TensorRT-LLM's ScheduledRequests are the models. As there, the scheduler keeps the
KV cache's books itself (slots and blocks allocated, grown and freed through the KV interface, cached prefixes
mapped); everything else the plan names is the loop's to carry out: the preempted requests' decode-policy state
and the freed slots' state beside the KV manager (next tokens, a device cache's rows), the admitted beam searches'
start, then the prefill chunks and the decode. The loop reads which requests run and how many tokens each feeds
from here, not by asking the scheduler again mid-step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.runner.request_state import RequestState


@dataclass(frozen=True)
class StepPlan:
    preempted: tuple[RequestState, ...]  # sent back to waiting this step, their KV freed (recomputed when readmitted)
    freed: tuple[tuple[int, int], ...]  # (slot, positions it had written) of each slot the preemptions freed
    admitted: tuple[RequestState, ...]  # took a slot this step (in admission order)
    prefill: tuple[tuple[RequestState, int], ...]  # (request, context tokens it feeds now): a chunk or the rest
    # one token each after the prefill calls, in admission order: the requests past their prefill and those whose
    # prefill ends in this step (the step skips one that finished or failed on the way)
    decode: tuple[RequestState, ...]

