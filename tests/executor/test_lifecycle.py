"""Request and executor lifecycle on the real SmolLM2 engine: validation at submit, the queue limit,
cancellation, shutdown with and without draining, asyncio consumers, ownership of the LLM, and an
engine failure that fails its requests without hanging anyone."""

from __future__ import annotations

import asyncio

import pytest

from engine_builder import LLM, SamplingParams
from engine_builder.executor import Executor, RequestFailed, SchedulerConfig
from engine_builder.util.errors import CapacityError, InputError

LONG = SamplingParams(max_new_tokens=200, temperature=0, ignore_eos=True)


def _first_tokens(handle, n: int = 1) -> list:
    events = []
    for event in handle.events(timeout=60):
        events.append(event)
        if len(handle.token_times) >= n:
            return events
    raise AssertionError(f"request {handle.id} finished before {n} tokens")


def test_bad_requests_raise_at_submit_and_queue_nothing(llm):
    with Executor(llm) as executor:
        with pytest.raises(InputError, match=r"the prompt has 2\d\d tokens but the engine takes at most 128"):
            executor.submit(llm.encode("word " * 200), SamplingParams(max_new_tokens=4))
        with pytest.raises(CapacityError, match="exceeds the engine's max_seq_len 256"):
            executor.submit(llm.encode("Hello world"), SamplingParams(max_new_tokens=255))
        with pytest.raises(InputError, match="prompt is empty"):
            executor.submit([], SamplingParams(max_new_tokens=4))
        with pytest.raises(InputError, match="must be in \\[0, 49152\\)"):
            executor.submit([1, 49152], SamplingParams(max_new_tokens=4))
        with pytest.raises(InputError, match="must be in \\[0, 49152\\)"):  # was an OverflowError
            executor.submit([1, -1], SamplingParams(max_new_tokens=4))
        with pytest.raises(CapacityError, match="num_beams 5 needs one KV slot per beam"):
            executor.submit(llm.encode("Hello"), SamplingParams(max_new_tokens=4, num_beams=5))
        assert executor.stats().queue_depth == 0 and executor.stats().steps == 0


def test_cancel_frees_the_slot_and_ends_the_stream(llm):
    with Executor(llm) as executor:
        handle = executor.submit(llm.encode("Tell me a story"), LONG)
        streamed = _first_tokens(handle, 2)
        assert executor.stats().free_slots == 3
        handle.cancel()
        handle.cancel()  # idempotent
        rest = list(handle.events(timeout=30))[len(streamed):]
        final = rest[-1]
        assert (final.finished, final.finish_reason, final.token_id, final.text) == (True, "cancelled", None, "")
        stats = executor.stats()  # the slot was free before the final event was sent
        assert (stats.free_slots, stats.running, stats.requests_cancelled) == (4, 0, 1)
        out = handle.result()
        assert out.finish_reason == "cancelled" and 2 <= len(out.token_ids) < 200
        assert list(out.token_ids) == [e.token_id for e in streamed + rest if e.token_id is not None]
        handle.cancel()  # after the end: a no-op
        assert executor.stats().requests_cancelled == 1


def test_cancel_a_queued_request(llm):
    with Executor(llm, SchedulerConfig(max_batch=1)) as executor:
        running = executor.submit(llm.encode("Tell me a story"), SamplingParams(max_new_tokens=12, temperature=0))
        _first_tokens(running)
        queued = executor.submit(llm.encode("Never runs"), LONG)
        assert executor.stats().queue_depth == 1
        queued.cancel()
        assert [e.finish_reason for e in queued.events(timeout=30)] == ["cancelled"]
        assert queued.result().token_ids == () and queued.first_token_time is None
        assert running.result(timeout=60).finish_reason in ("stop", "length")
        assert executor.stats().queue_depth == 0


def test_max_queue_overflow_raises_capacity_error(llm):
    with Executor(llm, SchedulerConfig(max_batch=1, max_queue=2)) as executor:
        running = executor.submit(llm.encode("Tell me a story"), LONG)
        _first_tokens(running)  # admitted: the queue is empty again
        queued = [executor.submit(llm.encode(f"Request {i}"), SamplingParams(max_new_tokens=2)) for i in range(2)]
        with pytest.raises(CapacityError, match=r"2 requests are already waiting \(max_queue 2\); retry later"):
            executor.submit(llm.encode("One too many"), SamplingParams(max_new_tokens=2))
        assert executor.stats().queue_depth == 2
        executor.shutdown(drain=False)
    assert [h.result().finish_reason for h in (running, *queued)] == ["cancelled"] * 3


def test_shutdown_with_drain_finishes_everything(llm):
    prompts = ["The capital of France is", "Water boils at", "Hi", "List three colors:", "Count: 1, 2,"]
    params = SamplingParams(max_new_tokens=6, temperature=0)
    alone = llm.generate(prompts, params)
    executor = Executor(llm)
    handles = [executor.submit(llm.encode(p), params) for p in prompts]  # 5 > 4 slots: one waits
    executor.shutdown(drain=True)
    assert [h.result(timeout=0).token_ids for h in handles] == [o.token_ids for o in alone]
    with pytest.raises(InputError, match="the executor is shut down"):
        executor.submit(llm.encode("late"), params)
    executor.shutdown()  # idempotent
    assert llm.generate("Hi", params)[0].token_ids == alone[2].token_ids  # the LLM is free again


def test_shutdown_without_drain_cancels_everything(llm):
    executor = Executor(llm, SchedulerConfig(max_batch=2))
    handles = [executor.submit(llm.encode(f"Story number {i}:"), LONG) for i in range(4)]
    _first_tokens(handles[0])
    executor.shutdown(drain=False)
    assert [h.result(timeout=0).finish_reason for h in handles] == ["cancelled"] * 4
    assert handles[3].result().token_ids == ()  # never admitted
    stats = executor.stats()
    assert (stats.requests_cancelled, stats.running, stats.queue_depth) == (4, 0, 0)


def test_drain_timeout_cancels_what_is_left(llm):
    executor = Executor(llm)
    handle = executor.submit(llm.encode("Tell me a story"), LONG)
    _first_tokens(handle)
    executor.shutdown(drain=True, timeout=0.2)
    assert handle.result(timeout=0).finish_reason == "cancelled"


def test_aevents_with_concurrent_consumers(llm):
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time"]
    params = SamplingParams(max_new_tokens=10, temperature=0)
    alone = llm.generate(prompts, params)

    async def consume(handle) -> list:
        return [e async for e in handle.aevents()]

    async def late_consumer(handle) -> list:
        async for _ in handle.aevents():  # wait until it has streamed, then subscribe again
            break
        await asyncio.sleep(0.05)
        return await consume(handle)

    async def main(executor) -> list:
        handles = [executor.submit(llm.encode(p), params) for p in prompts]
        return await asyncio.gather(*(consume(h) for h in handles), late_consumer(handles[0]))

    with Executor(llm) as executor:
        *streams, late = asyncio.run(main(executor))
    for events, ref in zip(streams, alone):
        assert [e.token_id for e in events] == list(ref.token_ids) and events[-1].finished
        assert "".join(e.text for e in events) == ref.text
    assert late == streams[0]  # a late subscriber gets every event, once, in order


def test_the_executor_owns_the_llm_while_it_runs(llm):
    with Executor(llm) as executor:
        with pytest.raises(InputError, match=r"already generating \(an Executor serves it\); submit requests"):
            llm.generate("Hi", SamplingParams(max_new_tokens=2))
        with pytest.raises(InputError, match="already generating"):
            Executor(llm)
        assert executor.submit(llm.encode("Hi"), SamplingParams(max_new_tokens=2)).result(timeout=30).token_ids
    stream = llm.stream("Tell me a story", SamplingParams(max_new_tokens=8))
    next(stream)
    with pytest.raises(InputError, match=r"already generating \(an unfinished stream\?\)"):
        Executor(llm)
    stream.close()


def test_an_engine_failure_fails_its_requests_and_the_executor_lives_on(smollm2_engine):
    # a second LLM: its backend is closed under the running executor, a real onnxruntime failure
    llm = LLM(smollm2_engine, backend="onnxruntime")
    executor = Executor(llm)
    handle = executor.submit(llm.encode("Tell me a story"), LONG)
    _first_tokens(handle)
    llm.backend.close()
    events = list(handle.events(timeout=30))
    # the closed backend's own exception (which one depends on where the step was), named for the client
    assert events[-1].finish_reason == "error" and events[-1].error.split(":")[0].endswith("Error")
    assert events[-1].token_id is None
    with pytest.raises(RequestFailed, match=f"request {handle.id} failed: "):
        handle.result()
    later = executor.submit(llm.encode("Hi"), SamplingParams(max_new_tokens=2))  # still serving
    assert [e.finish_reason for e in later.events(timeout=30)][-1] == "error"
    stats = executor.stats()
    assert (stats.requests_failed, stats.running, stats.free_slots) == (2, 0, 4)
    executor.shutdown()
    assert llm.backend.kv.num_free == 4
