"""The executor's scheduling policy: who runs, how much KV each may hold, how many prompt tokens run per step.

    grow      first, every running request gets the KV blocks this step writes into (its next decode
              token(s), or the rest of its context), most urgent first; when blocks run out, the least
              urgent, newest running request is preempted by recompute (kv_growth.py, preemption.py),
              and nobody new is admitted this step.
    admit     by priority (lower first), then arrival: a waiting request enters when a row is free
              (fewer than max_batch run, a KV slot is free) and the KV budget has the blocks of its
              context plus the next step's tokens (optimistic, as vLLM: not prompt + max_new_tokens),
              keeping a watermark of free blocks for the running requests' growth. The budget is one
              (runner/kv/block_budget.py), kept by the KV cache: a paged engine's pool (capped by
              kv_budget_tokens when given), a slot engine's pool of counts. It, not the slot count, is
              what bounds concurrency: with a budget of 4 full max_seq_len sequences an engine with 32
              slots runs 32 short requests together. A more urgent request that does
              not fit preempts less urgent ones (preemption.py: recompute, identical tokens); a
              long request that does not fit may be overtaken by smaller ones at most max_overtakes
              times, then it blocks those behind it until it fits (admission.py).
    prefill   requests whose context is not fully in the cache share a budget of max_tokens_per_step
              tokens per step while others decode (auto by default: what costs about one decode step,
              step_budget.py), so a long prompt does not stall the decoders; split fair between them
              (chunked_prefill.py). With nothing decoding the budget is one engine call's worth. A
              request continues next step where it stopped.
    decode    every admitted request past its prefill feeds its last token in one batched call.

It plans over the KV interface alone, which keeps the books (no backend, no Generator, no budget of its own:
tests run it over a bare KV manager, tests/runner/test_scheduler_alone.py); the step loop carries out the plan
(engine_step.py). It belongs to the executor thread, except `waiting`, which Executor.submit appends to under
the executor's lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine_builder.runner.kv.block_budget import KVBudgetStats
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.prefix_cache import PrefixCache
from engine_builder.runner.request_state import RequestState
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.admission import Room, plan_admission
from engine_builder.runner.scheduling.chunked_prefill import plan_chunks
from engine_builder.runner.scheduling.kv_growth import grow_or_preempt
from engine_builder.runner.scheduling.preemption import Resumes
from engine_builder.runner.scheduling.step_budget import StepBudget
from engine_builder.runner.scheduling.step_plan import StepPlan
from engine_builder.runner.tunables import KV_BUDGET_BLOCK_TOKENS, WATERMARK_SHARE
from engine_builder.util.errors import CapacityError, ConfigError, InputError


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int | None = None  # concurrent sequences; None = the engine's KV slots (its max_batch); must be <= that
    # prompt tokens prefilled per step while other requests decode (chunked prefill); decodes always get theirs.
    # None = auto: sized so a step's prefill costs about one decode step (step_budget.py)
    max_tokens_per_step: int | None = None
    max_queue: int = 256  # waiting requests beyond which submit() raises CapacityError (a server answers 429)
    # KV cache budget in tokens for all running sequences together; None = what the KV cache holds (every slot's
    # max_seq_len; a paged engine's pool). The KV cache keeps it (KVCache.budget_for): a paged pool is capped by it
    kv_budget_tokens: int | None = None
    kv_block_tokens: int = KV_BUDGET_BLOCK_TOKENS  # a slot engine's budget counts blocks of this many tokens
    preemption: bool = True  # a more urgent request may preempt less urgent ones (recompute)
    max_overtakes: int = 8  # times smaller requests may overtake one that does not fit before it blocks them
    batch_prefill: bool = True  # short prompts finishing their prefill in a step share one call (prefill_groups.py)

    def __post_init__(self) -> None:
        for name, low in (("max_batch", 1), ("max_tokens_per_step", 1), ("max_queue", 0), ("kv_budget_tokens", 1),
                          ("kv_block_tokens", 1), ("max_overtakes", 0)):
            value = getattr(self, name)
            if value is None and name in ("max_batch", "kv_budget_tokens", "max_tokens_per_step"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"SchedulerConfig.{name} must be an integer >= {low}, got {value!r}")
        for flag in ("preemption", "batch_prefill"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"SchedulerConfig.{flag} must be true or false, got {getattr(self, flag)!r}")

    def batch_for(self, kv_slots: int) -> int:
        """max_batch on an engine with kv_slots KV cache slots."""
        if self.max_batch is None:
            return kv_slots
        if self.max_batch > kv_slots:
            raise ConfigError(f"max_batch {self.max_batch} exceeds the engine's {kv_slots} KV cache slots "
                              f"(its max_batch); use max_batch {kv_slots} or less, or rebuild with a larger max_batch")
        return self.max_batch


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCache, *, max_input_len: int, step_tokens: int = 1,
                 prefix_cache: PrefixCache | None = None) -> None:
        """kv: the KV cache it keeps the books of; max_input_len: the most tokens one engine call takes (a prefill
        chunk's cap); step_tokens: KV positions one decode step may write per request (speculative: more);
        prefix_cache: where a readmitted request's cached prompt blocks come from."""
        self.config = config
        self.kv, self.max_input_len = kv, max_input_len
        self.max_batch = config.batch_for(kv.batch_slots)
        # the KV cache's blocks under this config; it takes them (use_budget) when this scheduler plans a step, not
        # here: LLM.generate checks requests with a scheduler of its own before it may drive (an Executor may)
        self.budget = kv.budget_for(config.kv_budget_tokens, config.kv_block_tokens)
        self.watermark = max(1, int(self.budget.blocks * WATERMARK_SHARE))
        self.lookahead = step_tokens  # positions one decode step may write per request
        self.resumes = Resumes(kv, prefix_cache)
        self._freed: list[tuple[int, int]] = []  # this step's preemptions' slots, for the plan
        self.step_budget = StepBudget(config.max_tokens_per_step)
        self.waiting: deque[RequestState] = deque()  # submitted or preempted, no slot
        self.running: dict[int, RequestState] = {}  # request id -> state, in admission order
        self._skips: dict[int, int] = {}  # request id -> times smaller requests overtook it (fair share)
        self.chunked_prefill_steps = 0  # prefill chunks that left part of their context for a later step

    # --- admission --------------------------------------------------------------------------------

    def required(self, r: RequestState) -> int:
        """KV positions r must have room for before this step: its context (prompt + generated, what a
        resumed request prefills again) and the next step's tokens, at most its whole reservation. A beam search's
        beams hold their whole reservation from admission (Generator.admit)."""
        if r.params.num_beams > 1:
            return len(r.prompt_ids) + r.params.max_new_tokens
        return min(len(r.prompt_ids) + r.params.max_new_tokens, len(r.prompt_ids) + len(r.token_ids) + self.lookahead)

    def need(self, r: RequestState) -> int:
        """KV budget blocks r needs now (optimistic admission: it grows later, grow()), for each of its beams."""
        return self.budget.blocks_for(self.required(r)) * r.params.num_beams

    def held(self, r: RequestState) -> int:
        """KV budget blocks r's slots hold (what preempting it gives back)."""
        return sum(self.kv.held_blocks(s) for s in r.slots)

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Refuse a request the KV budget could never hold, before it waits forever: InputError, since retrying
        cannot help (a server answers 422, where a full queue's CapacityError is 429)."""
        if params.num_beams > self.max_batch:
            raise InputError(f"num_beams {params.num_beams} needs a sequence per beam but at most {self.max_batch} "
                             "run at once (max_batch); lower num_beams or raise max_batch")
        budget = self.budget
        blocks = budget.blocks_for(len(prompt_ids) + params.max_new_tokens) * params.num_beams
        if blocks > budget.blocks:
            raise InputError(f"prompt {len(prompt_ids)} tokens + max_new_tokens {params.max_new_tokens} needs "
                             f"{blocks} KV blocks of {budget.block_tokens} tokens, the KV budget holds "
                             f"{budget.blocks} ({budget.tokens} tokens); lower max_new_tokens or raise the budget")

    def schedule(self) -> StepPlan:
        """This step's plan: grow the running requests' KV (preempting when blocks run out), then admit what fits
        unless that preempted anyone (those just preempted would be readmitted only to thrash), then size the
        prefill chunks and name the decoders."""
        self.kv.use_budget(self.budget)  # the KV cache counts by this scheduler's budget (a no-op once it does)
        before = set(self.running)
        self._freed = []
        preempted = self.grow()
        if not preempted:
            preempted = self.admit()
        prefill = tuple(self.prefill_plan())
        feeds = {r.index: n for r, n in prefill}
        decode = tuple(r for r in self.running.values() if self.resumes.prefill_left(r) <= feeds.get(r.index, 0))
        return StepPlan(tuple(preempted), tuple(self._freed),
                        tuple(r for i, r in self.running.items() if i not in before), prefill, decode)

    def grow(self) -> list[RequestState]:
        """Blocks for this step's writes to every running request, most urgent first; preempts the least
        urgent while they run out (kv_growth.py). Returns the preempted."""
        kv = self.kv

        def shortfall(r: RequestState) -> int:
            n = self.required(r)
            return sum(kv.blocks_to_grow(s, n) for s in r.slots)

        def grow(r: RequestState) -> None:
            for slot in r.slots:
                kv.grow(slot, self.required(r))

        return grow_or_preempt(list(self.running.values()), shortfall=shortfall, fits=kv.has_blocks, grow=grow,
                               preempt=self._preempt)

    def _preempt(self, r: RequestState) -> None:
        del self.running[r.index]
        self._freed += self.resumes.preempt(r)  # its slots, and with them its blocks, go back to the KV cache
        self.waiting.append(r)

    def admit(self) -> list[RequestState]:
        """Admit what fits now, preempting less urgent requests for more urgent ones; returns the preempted."""
        if not self.waiting:
            return []  # nobody to admit, nobody to preempt for
        kv = self.kv
        rows = sum(r.params.num_beams for r in self.running.values())
        room = Room(min(self.max_batch - rows, kv.num_free), self._free_blocks())
        plan = plan_admission(self.waiting, list(self.running.values()), room, need=self.need,
                              held=self.held, skips=self._skips,
                              max_overtakes=self.config.max_overtakes, preempt=self.config.preemption,
                              watermark=self.watermark, width=lambda r: r.params.num_beams)
        for r in plan.preempt:
            self._preempt(r)
        admitted = set()
        for r in plan.admit:
            n = self.required(r)
            # the KV cache's room now (the plan counted a preempted request's blocks as freed, and a paged pool's
            # block it shares with another is not), keeping a watermark for the running ones' growth
            if not kv.admits(n * r.params.num_beams, WATERMARK_SHARE if self.running or admitted else 0.0):
                break
            try:
                r.take_slots(kv.allocate_sequences(r.index, len(r.prompt_ids), r.params.max_new_tokens,
                                                   r.params.num_beams, n))
            except CapacityError:  # the pool is short even for a first request: the rest wait a step
                break
            admitted.add(r.index)
            self._skips.pop(r.index, None)
            self.running[r.index] = r
            self.resumes.load_prompt(r)
        if admitted:
            self.waiting = deque(r for r in self.waiting if r.index not in admitted)
        return list(plan.preempt)

    def _free_blocks(self) -> int:
        """The KV cache's available blocks, or as many as every waiting request and the watermark take (the plan
        decides the same either way): a paged pool counts its evictable cached prefixes by walking the radix tree,
        which at a large cache would cost a step's host time; has_blocks asks its free blocks first."""
        enough = self.watermark + sum(self.need(r) for r in self.waiting)
        return enough if self.kv.has_blocks(enough) else self.kv.available_blocks()

    # --- prefill and decode -----------------------------------------------------------------------

    def prefill_plan(self) -> list[tuple[RequestState, int]]:
        """(request, context tokens to feed now) within this step's budget."""
        pending = [(r, r.params.priority, left) for r in self.running.values()
                   if (left := self.resumes.prefill_left(r))]
        if not pending:
            return []
        max_chunk = self.max_input_len
        decoding = any(r.token_ids and not self.resumes.prefill_left(r) for r in self.running.values())
        step = self.step_budget.tokens()
        budget = step if decoding else max(step, max_chunk)
        plan = plan_chunks(pending, budget, max_chunk)
        left = {r.index: n for r, _, n in pending}
        self.chunked_prefill_steps += sum(n < left[r.index] for r, n in plan)
        return plan

    # --- leaving ----------------------------------------------------------------------------------

    def _forget(self, r: RequestState) -> None:
        self.resumes.forget(r)
        self._skips.pop(r.index, None)

    def remove(self, ids: Iterable[int]) -> list[RequestState]:
        """Take these requests out of the queue and the running set (cancel, failure); slots are
        the caller's to release. Unknown ids (already finished) are ignored."""
        ids = set(ids)
        out = [r for r in self.waiting if r.index in ids]
        if out:
            self.waiting = deque(r for r in self.waiting if r.index not in ids)
        out += [self.running.pop(i) for i in ids if i in self.running]
        for r in out:
            self._forget(r)
        return out

    def retire_finished(self) -> list[RequestState]:
        """Drop finished requests from the running set (their slots were freed when they finished)."""
        done = [r for r in self.running.values() if r.finished]
        for r in done:
            del self.running[r.index]
            self._forget(r)
        return done

    def kv_stats(self) -> KVBudgetStats:
        """The KV budget's figures (this scheduler's, even before it planned a step), asked of the KV cache; safe
        from another thread (Executor.stats)."""
        return KVBudgetStats(self.budget.block_tokens, self.budget.blocks, self.kv.used_blocks())

    @property
    def all_ids(self) -> list[int]:
        return [r.index for r in self.waiting] + list(self.running)
