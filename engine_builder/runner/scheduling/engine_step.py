"""One scheduled step's engine work: what the plan asks of the loop, the prefill calls, then one batched decode.

    scheduler = scheduler_for(config, generator)
    plan = next_plan(scheduler, generator)
    events, failures = run_engine_step(scheduler, generator, plan, prefills)

The Executor (engine_builder/executor/executor.py) and LLM.generate (block_admission.py) both run this, so
a request gets the same engine calls, and so the same tokens, whichever of the two drives it. Failures are
returned, not raised: the Executor fails just the requests of the call that broke and goes on, LLM.generate
raises the first one.
"""

from __future__ import annotations

import time

from engine_builder.runner.batched_prefill import prefill_together
from engine_builder.runner.generate import Generator
from engine_builder.runner.request_state import Event, RequestState, StepClock
from engine_builder.runner.scheduling.prefill_groups import PrefillGroups
from engine_builder.runner.scheduling.scheduler import Scheduler, SchedulerConfig
from engine_builder.runner.scheduling.step_plan import StepPlan

Failure = tuple[RequestState, BaseException]


def scheduler_for(config: SchedulerConfig, gen: Generator) -> Scheduler:
    """The scheduler of gen's KV cache, with its engine's limits."""
    return Scheduler(config, gen.backend.kv, max_input_len=gen.backend.max_input_len, step_tokens=gen.step_tokens,
                     prefix_cache=gen.prefix_cache)


def next_plan(sched: Scheduler, gen: Generator) -> StepPlan:
    """The scheduler's plan for the next step, and at once what it asks of the loop before any engine work: the
    preempted requests' decode-policy state dropped and their freed slots cleared, the admitted beam searches
    started."""
    plan = sched.schedule()
    gen.clear_slots(plan.preempted, plan.freed)
    gen.admitted(plan.admitted)
    return plan


def run_engine_step(sched: Scheduler, gen: Generator, plan: StepPlan, prefills: PrefillGroups,
                    clock: StepClock | None = None) -> tuple[list[Event], list[Failure]]:
    """The plan's prefill chunks (short whole prompts share one engine call: prefill_groups.py), then one decode
    over the plan's decoders that are past their prefill and unfinished. Returns the step's events
    and the requests whose engine call (or sampling) raised, with what it raised. clock (LLM.generate's Timings)
    gets the prefill time and the decode step."""
    events: list[Event] = []
    failures: list[Failure] = []
    prefill_started = time.perf_counter()
    for group in prefills.plan(gen, list(plan.prefill)):
        started = time.perf_counter()
        planned = fed = sum(n for _, n in group)
        try:
            if len(group) == 1:
                gen.prefill(group[0][0], events, group[0][1])
            else:
                prefills.batched_calls += 1
                prefills.batched_requests += len(group)
                fed = prefill_together(gen, [r for r, _ in group], events)
        except Exception as exc:  # this call's engine run or sampling failed: its unfinished requests fail
            failures += [(r, exc) for r, _ in group if not r.finished]  # a finished one's final event is out
        seconds = time.perf_counter() - started
        sched.step_budget.observe_prefill(planned, seconds)
        prefills.observe(fed, seconds)
    failed_ids = {r.index for r, _ in failures}
    decoding = {slot: r for r in plan.decode
                if r.index not in failed_ids and not r.finished and r.token_ids and not sched.resumes.prefill_left(r)
                for slot in r.slots}  # a beam search decodes a row per beam
    try:
        gen.reprefill(decoding, events)
        if clock is not None:
            clock.prefill += time.perf_counter() - prefill_started
        if decoding:
            started = time.perf_counter()
            rows = max(decoding) + 1  # the step runs slots [0, highest): free ones ride along
            gen.decode(decoding, events, clock)
            sched.step_budget.observe_decode(time.perf_counter() - started)
            prefills.observe(rows, time.perf_counter() - started)
    except Exception as exc:  # the batched call failed: every request in it fails
        failures += [(r, exc) for r in {r.index: r for r in decoding.values()}.values() if not r.finished]
    return events, failures
