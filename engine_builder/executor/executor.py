"""In-flight (continuous) batching: one thread serves requests that arrive and leave at any step.

    executor = Executor(LLM("engine-dir"), SchedulerConfig(max_batch=8))
    handle = executor.submit(llm.encode("The capital of France is"), SamplingParams(max_new_tokens=16))
    for event in handle.events(): print(event.text, end="")      # or: async for event in handle.aevents()
    executor.shutdown()

Each step of the loop: take cancellations (their slots are freed at once) -> grow the running requests'
KV by the blocks this step writes, preempting the least urgent when blocks run out -> admit waiting
requests (by priority and KV budget, preempting less urgent ones: scheduler.py)
-> prefill chunks within the step's token budget (short whole prompts share one engine call:
prefill_groups.py, runner/batched_prefill.py) -> one batched decode for
every running sequence -> emit each new token to its handle -> retire finished requests. New
requests join at the next step boundary: nobody waits for a batch to drain.

It drives the same step functions as LLM.generate (Generator.admit / prefill / decode / release
in engine_builder/runner/generate.py), so a request's tokens are the ones LLM.generate gives for it
alone: greedy rows and seeded requests (each with its own numpy generator) do not depend on what
else shares the batch. Unseeded sampling requests draw from the LLM's shared generator.

While it runs the executor owns the LLM's Generator: LLM.generate / stream on the same LLM raise
InputError instead of corrupting the KV cache; shutdown() gives it back.

Errors: an exception in one request's prefill fails that request; one in the batched decode fails
the requests in that call; both end with an event whose finish_reason is "error", and the loop
goes on. If the loop's own bookkeeping fails, every request gets that error event and the
executor stops (submit then raises InputError): a client never waits forever.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine_builder.executor.request import RequestHandle, TokenEvent
from engine_builder.runner.core.image_prompt import ImagePrompt
from engine_builder.runner.request_state import Event, RequestState
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.scheduling.engine_step import next_plan, run_engine_step, scheduler_for
from engine_builder.runner.scheduling.prefill_groups import PrefillGroups
from engine_builder.runner.scheduling.scheduler import SchedulerConfig
from engine_builder.util.errors import CapacityError, InputError

if TYPE_CHECKING:
    from engine_builder.runner.llm import LLM


@dataclass(frozen=True)
class ExecutorStats:
    queue_depth: int  # submitted, waiting for a slot
    running: int  # holding a KV slot (prefilling or decoding)
    max_batch: int
    free_slots: int  # max_batch - running
    requests_finished: int  # ended with "stop" or "length"
    requests_cancelled: int
    tokens_generated: int
    steps: int  # loop steps that ran the engine
    requests_failed: int = 0  # ended with "error"
    kv_block_tokens: int = 0  # the KV budget (runner/kv/block_budget.py; a paged engine's pool): tokens per block
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0  # held by running requests (context so far + the next step's tokens each, in blocks)
    preemptions: int = 0  # running requests preempted (recompute): for more urgent ones, or when blocks ran out
    chunked_prefill_steps: int = 0  # prefill chunks that left part of a prompt for a later step
    batched_prefill_calls: int = 0  # engine calls that prefilled several requests at once (prefill_groups.py)
    batched_prefill_requests: int = 0  # requests prefilled in such a call


class Executor:
    def __init__(self, llm: LLM, config: SchedulerConfig = SchedulerConfig()) -> None:
        """Start serving `llm` in a thread of its own (it owns llm's Generator until shutdown)."""
        self.llm = llm
        self.config = config
        self._generator = llm.generator
        self._scheduler = scheduler_for(config, self._generator)
        self._prefills = PrefillGroups(config.batch_prefill)  # which prefills share an engine call
        self._generator.claim("an Executor serves it", "submit requests to the Executor, or shut it down first")
        self._lock = threading.Condition()
        self._ids = itertools.count()
        self._handles: dict[int, RequestHandle] = {}  # unfinished requests
        self._cancels: set[int] = set()
        self._accepting = True
        self._cancel_all = False
        self._closed_reason = "the executor is shut down; create a new Executor to serve more requests"
        self._finished = self._cancelled = self._failed = self._tokens = self._steps = 0
        self._thread = threading.Thread(target=self._run, name="trtbuild-executor", daemon=True)
        self._thread.start()

    # --- the client's side ----------------------------------------------------------------------

    def submit(self, prompt_token_ids: Sequence[int], params: SamplingParams,
               image: ImagePrompt | None = None) -> RequestHandle:
        """Queue a request and return its handle. Raises here, in the caller's thread: InputError /
        CapacityError for a request the engine can never run (Generator.check), CapacityError when
        max_queue requests already wait, InputError after shutdown."""
        if not isinstance(params, SamplingParams):
            raise InputError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = [int(t) for t in prompt_token_ids]
        self._generator.check(ids, params)
        self._scheduler.check(ids, params)
        request_id = next(self._ids)
        state = self._generator.new_request(request_id, ids, params, image)  # checks the ids against the vocab
        handle = RequestHandle(request_id, tuple(ids), params, self._cancel)
        handle.prompt_logprobs = state.prompt_logprobs  # filled by this thread's prefill, before any event
        with self._lock:
            if not self._accepting:
                raise InputError(self._closed_reason)
            if len(self._scheduler.waiting) >= self.config.max_queue:
                raise CapacityError(f"{len(self._scheduler.waiting)} requests are already waiting (max_queue "
                                    f"{self.config.max_queue}); retry later, or raise max_queue")
            self._handles[request_id] = handle
            self._scheduler.waiting.append(state)
            self._lock.notify_all()
        return handle

    def stats(self) -> ExecutorStats:
        with self._lock:
            sched = self._scheduler
            running, max_batch, kv = len(sched.running), sched.max_batch, sched.kv_stats()
            return ExecutorStats(len(sched.waiting), running, max_batch, max_batch - running,
                                 self._finished, self._cancelled, self._tokens, self._steps, self._failed,
                                 kv.block_size, kv.total_blocks, kv.used_blocks, sched.resumes.preemptions,
                                 sched.chunked_prefill_steps, self._prefills.batched_calls,
                                 self._prefills.batched_requests)

    @property
    def alive(self) -> bool:
        """Is the loop thread running? It ends only on shutdown or after an internal error."""
        return self._thread.is_alive()

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting requests. drain: finish the running and queued ones (for at most timeout
        seconds, then cancel what is left); else cancel them all now. Returns once the thread has
        ended and the LLM is free again. Idempotent."""
        with self._lock:
            self._accepting = False
            self._cancel_all = self._cancel_all or not drain
            self._lock.notify_all()
        self._thread.join(timeout if drain else None)
        if self._thread.is_alive():
            with self._lock:
                self._cancel_all = True
                self._lock.notify_all()
            self._thread.join()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(drain=exc[0] is None)

    def _cancel(self, handle: RequestHandle) -> None:
        with self._lock:
            self._cancels.add(handle.id)
            self._lock.notify_all()

    # --- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as exc:  # the loop itself broke: fail everyone, never leave a client waiting
            self._stop_after(exc)
        finally:
            self._generator.unclaim()

    def _step(self) -> bool:
        """One step; False once shut down with nothing left."""
        sched, gen = self._scheduler, self._generator
        with self._lock:
            while self._accepting and not (sched.waiting or sched.running or self._cancels):
                self._lock.wait()
            cancel = set(sched.all_ids) if self._cancel_all else self._cancels
            self._cancels = set()
            cancelled = sched.remove(cancel)
            for r in cancelled:
                if r.slot is not None:
                    gen.release(r)
            plan = next_plan(sched, gen)
            if not (sched.waiting or sched.running or cancelled) and not self._accepting:
                return False
        for r in cancelled:
            self._end(r, TokenEvent(None, "", None, True, "cancelled"))
        if not sched.running:
            return True

        events, failures = run_engine_step(sched, gen, plan, self._prefills)  # prefill chunks, then one decode

        with self._lock:  # retire before emitting: a client that sees its final event sees its slot free
            finished = sched.retire_finished()
            failed = sched.remove(r.index for r, _ in failures)
            for r in failed:
                if r.slot is not None:
                    gen.release(r)
            self._steps += 1
            self._tokens += sum(e.token_id is not None for e in events)
        self._emit(events, {r.index: r for r in finished})
        for r, exc in failures:
            self._end(r, TokenEvent(None, "", None, True, "error", f"{type(exc).__name__}: {exc}"))
        return True

    def _emit(self, events: Iterable[Event], finished: dict[int, RequestState]) -> None:
        for e in events:
            handle = self._handles[e.request]
            r = finished.get(e.request) if e.finished else None
            event = TokenEvent(e.token_id, e.text, e.logprobs, e.finished, r.finish_reason if r else None)
            if r is None:
                handle._emit(event)
            else:
                self._end(r, event)

    def _end(self, r: RequestState, event: TokenEvent) -> None:
        """Deliver a request's final event and count it."""
        with self._lock:
            handle = self._handles.pop(r.index)
            if event.finish_reason == "cancelled":
                self._cancelled += 1
            elif event.finish_reason == "error":
                self._failed += 1
            else:
                self._finished += 1
        handle._emit(event, r.stop_reason)

    def _stop_after(self, exc: BaseException) -> None:
        with self._lock:
            self._accepting = False
            self._closed_reason = (f"the executor stopped after an internal error ({type(exc).__name__}: {exc}); "
                                   "create a new Executor")
            left = self._scheduler.remove(self._scheduler.all_ids)
        for r in left:
            if r.slot is not None:
                try:
                    self._generator.release(r)
                except Exception:  # noqa: BLE001  (best effort: the backend itself may be what broke)
                    pass
        with self._lock:  # every unfinished handle, also one caught between the queue and the running set
            handles, self._handles = list(self._handles.values()), {}
            self._failed += len(handles)
        for handle in handles:
            handle._emit(TokenEvent(None, "", None, True, "error", f"executor stopped: {type(exc).__name__}: {exc}"))
