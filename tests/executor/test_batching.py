"""In-flight batching on the real SmolLM2 engine: requests join and leave between steps, long prompts
are prefilled in chunks without stalling running decodes, and every request's output equals
LLM.generate of that request alone."""

from __future__ import annotations

import threading
import time

import pytest

from engine_builder import SamplingParams
from engine_builder.executor import Executor, SchedulerConfig

LONG_PROMPT = ("In the old harbour town, the fishermen gathered every morning before dawn to mend their nets, "
               "share the news, and argue about the weather while the gulls circled above the grey water and")


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, **kw)


def _wait_tokens(handle, n: int) -> None:
    """Block until the handle has streamed n tokens."""
    for event in handle.events(timeout=60):
        if len(handle.token_times) >= n or event.finished:
            return


def test_staggered_requests_from_threads_equal_each_alone(llm):
    cases = [
        ("The capital of France is", _greedy(16)),
        ("def fibonacci(n):", SamplingParams(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=7)),
        ("Once upon a time, in a small village,", SamplingParams(max_new_tokens=20, temperature=0.7, top_k=40,
                                                                 seed=123, logprobs=3)),
        ("List three fruits:", _greedy(9, stop=("\n\n",))),
        (LONG_PROMPT, SamplingParams(max_new_tokens=14, temperature=1.0, seed=99, repetition_penalty=1.2)),
        ("Water boils at", _greedy(6, logprobs=2)),
    ]
    alone = [llm.generate(prompt, params)[0] for prompt, params in cases]
    handles: dict[int, object] = {}

    with Executor(llm, SchedulerConfig(max_tokens_per_step=64)) as executor:
        def client(i: int) -> None:
            time.sleep(0.04 * i)  # staggered: later ones arrive while earlier ones decode
            prompt, params = cases[i]
            handles[i] = executor.submit(llm.encode(prompt), params)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outs = [handles[i].result(timeout=120) for i in range(len(cases))]
        stats = executor.stats()

    for (prompt, _), ref, out in zip(cases, alone, outs):
        assert out.token_ids == ref.token_ids, prompt
        assert (out.text, out.finish_reason, out.stop_reason) == (ref.text, ref.finish_reason, ref.stop_reason)
        assert out.logprobs == ref.logprobs
    assert outs[2].logprobs is not None and len(outs[2].logprobs) == len(outs[2].token_ids)
    assert stats.requests_finished == len(cases) and stats.running == stats.queue_depth == 0
    assert stats.tokens_generated == sum(len(o.token_ids) for o in outs)
    # they shared steps: fewer steps than tokens (sequentially each token but the first costs one)
    assert stats.steps < sum(len(o.token_ids) - 1 for o in outs)
    for i, h in handles.items():  # every token was streamed as an event, stamped in order
        events = list(h.events())
        assert [e.token_id for e in events if e.token_id is not None] == list(outs[i].token_ids)
        assert "".join(e.text for e in events) == outs[i].text and events[-1].finished
        assert h.arrival_time <= h.first_token_time == h.token_times[0] <= h.token_times[-1]


def test_a_request_joins_while_another_runs(llm):
    with Executor(llm) as executor:
        a = executor.submit(llm.encode("Tell me a long story about a dragon."), _greedy(40, ignore_eos=True))
        _wait_tokens(a, 3)
        b = executor.submit(llm.encode("The capital of France is"), _greedy(4, ignore_eos=True))
        b_out, a_out = b.result(timeout=60), a.result(timeout=120)
        stats = executor.stats()
    assert len(a_out.token_ids) == 40 and len(b_out.token_ids) == 4
    # b arrived mid-way through a, ran and finished while a kept decoding: it did not wait for a
    assert a.token_times[2] <= b.arrival_time < b.token_times[-1] < a.token_times[-1]
    assert sum(b.arrival_time < t < b.token_times[-1] for t in a.token_times) >= 2
    # and it added no step of its own: a's prefill step gives 2 tokens, then one step per token
    assert stats.steps == len(a_out.token_ids) - 1


def test_chunked_prefill_gives_the_unchunked_tokens(llm):
    prompts = [LONG_PROMPT, "Explain in detail how a steam engine converts heat into motion, step by step, "
                            "starting from the coal burning in the firebox and the water boiling in the boiler, "
                            "and ending at the wheels of the locomotive:"]
    lengths = [len(llm.encode(p)) for p in prompts]
    assert all(37 <= n <= 45 for n in lengths)
    params = _greedy(10, ignore_eos=True)
    alone = [llm.generate(p, params)[0] for p in prompts]  # prompt prefilled in one call

    with Executor(llm, SchedulerConfig(max_tokens_per_step=8)) as executor:
        out = executor.submit(llm.encode(prompts[0]), params).result(timeout=60)
        steps_alone = executor.stats().steps
    assert out.token_ids == alone[0].token_ids
    # alone, nobody decodes to be stalled: the prompt goes in one call (the budget binds only beside decoders),
    # whose step also decodes the second token, then one step per token
    assert steps_alone == len(out.token_ids) - 1

    # a long prompt arriving while another request decodes: the decode gets its token every step
    with Executor(llm, SchedulerConfig(max_tokens_per_step=8)) as executor:
        running = executor.submit(llm.encode("Count to twenty: one, two,"), _greedy(24, ignore_eos=True))
        _wait_tokens(running, 2)
        chunked = executor.submit(llm.encode(prompts[1]), params)
        chunked_out, running_out = chunked.result(timeout=60), running.result(timeout=60)
        stats = executor.stats()
    assert chunked_out.token_ids == alone[1].token_ids
    assert chunked.token_times[-1] < running.token_times[-1]
    assert stats.steps == len(running_out.token_ids) - 1  # the 5 prefill chunks rode on its decode steps
    assert llm.generate("Count to twenty: one, two,", _greedy(24, ignore_eos=True))[0].token_ids == \
        running_out.token_ids


def test_max_batch_is_respected(llm):
    seen_running: list[int] = []
    with Executor(llm, SchedulerConfig(max_batch=2)) as executor:
        handles = [executor.submit(llm.encode(p), _greedy(6, ignore_eos=True))
                   for p in ("One", "Two", "Three", "Four")]
        while not all(h.finished for h in handles):
            s = executor.stats()
            seen_running.append(s.running)
            assert s.running <= 2 and s.free_slots == 2 - s.running and s.max_batch == 2
            time.sleep(0.002)
        outs = [h.result() for h in handles]
    assert max(seen_running) == 2
    assert all(len(o.token_ids) == 6 for o in outs)
    # the later two got a slot only when one of the first two had finished
    first_done = min(handles[0].token_times[-1], handles[1].token_times[-1])
    assert handles[2].first_token_time > first_done and handles[3].first_token_time > first_done


def test_max_batch_above_the_engine_slots_is_refused(llm):
    from engine_builder.util.errors import ConfigError

    with pytest.raises(ConfigError, match=r"max_batch 5 exceeds the engine's 4 KV cache slots"):
        Executor(llm, SchedulerConfig(max_batch=5))
    with pytest.raises(ConfigError, match="max_tokens_per_step must be an integer >= 1"):
        SchedulerConfig(max_tokens_per_step=0)
    assert llm.generate("Hi", _greedy(2))[0].token_ids  # a refused executor did not keep the LLM
