"""LLM.generate / stream / chat admitted by free KV blocks: the Executor's Scheduler, driven synchronously.

    generator.admission = BlockAdmission(SchedulerConfig(kv_budget_tokens=4096))   # what LLM(...) does
    requests, events = generator.start(prompts, params)        # its sampled requests run through run()

Before, LLM.generate admitted a request when a KV slot was free and reserved prompt + max_new_tokens
positions for it up front (on a paged engine: that many blocks, or a CapacityError when the pool was short).
Now each step does what the server's executor does (scheduler.py): grow the running requests by the blocks
that step writes, preempting the least urgent by recompute when blocks run out, admit waiting ones by the
blocks of their context (the one KV budget the KV cache keeps: a paged engine's pool), prefill, decode: the
same step function (engine_step.py). So with a budget of 4 full max_seq_len sequences 32 short requests run at
once, each with the tokens it gets alone (tests/runner/test_generate_admission.py). A beam search request is
admitted with a row and its whole length of budget per beam and decodes in the same steps.

Prompts are prefilled whole when admitted, as before (max_tokens_per_step covers every slot's longest
prompt): offline generation has no stream to keep pace with, and a chunk starting past position 0 takes the
graph's other attention branch (batched_prefill.py), whose rounding a seeded draw can notice. Short prompts
admitted together share one call where that is exact (prefill_groups.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from engine_builder.runner.generate import Generator
from engine_builder.runner.request_state import Event, RequestState, StepClock
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.engine_step import next_plan, run_engine_step, scheduler_for
from engine_builder.runner.scheduling.prefill_groups import PrefillGroups
from engine_builder.runner.scheduling.scheduler import Scheduler, SchedulerConfig
from engine_builder.util.errors import CapacityError


class BlockAdmission:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.prefills = PrefillGroups(config.batch_prefill)  # its fitted call costs carry over between runs
        self.scheduler: Scheduler | None = None  # the last run's: its budget and preemption count

    def check(self, generator: Generator, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse, before any work, a request the KV budget could never hold (InputError)."""
        scheduler_for(self.config, generator).check(prompt_ids, params)

    def run(self, generator: Generator, requests: Sequence[RequestState], clock: StepClock) -> Iterator[Event]:
        """Generate for `requests`, yielding each step's events. Slots are the
        caller's to release when this stops early (Generator._loop); the budget is given back here."""
        sched = self.scheduler = scheduler_for(self.config, generator)
        sched.waiting.extend(requests)
        try:
            while sched.waiting or sched.running:
                started = time.perf_counter()
                plan = next_plan(sched, generator)
                clock.prefill += time.perf_counter() - started  # admission's cached-prefix copies count there
                if not sched.running:
                    raise CapacityError(_no_room(generator, sched))
                events, failures = run_engine_step(sched, generator, plan, self.prefills, clock)
                if failures:
                    raise failures[0][1]
                sched.retire_finished()
                yield from events
        finally:
            sched.remove(sched.all_ids)  # budget blocks of requests left running (an error, a closed stream)


def _no_room(generator: Generator, sched: Scheduler) -> str:
    """Nothing runs and nothing could be admitted: the next request alone does not fit. Not expected (start()
    checked the budget, and a paged pool holds at least one max_seq_len sequence), but a loop must not spin."""
    kv = generator.backend.kv
    r = min(sched.waiting, key=lambda w: (w.params.priority, w.index))
    tokens = len(r.prompt_ids) + len(r.token_ids) + sched.lookahead
    return (f"request {r.index} needs KV for {tokens} tokens to go on but {kv.capacity_words()} cannot hold it even "
            "alone; give "
            "LLM(kv_cache_memory=...) more bytes, or lower max_new_tokens")
