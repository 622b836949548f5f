"""Async scheduling (runner/async_decode.py) on the torch backend: each decode step launched before the last step's
tokens reach the host, its input ids taken on the device; the tokens, texts and finish reasons of the plain loop.

On a CPU (CI) the steps run synchronously, so this checks the bookkeeping (a token accepted a step late, finished
requests' extra rows dropped, requests joining and leaving, preemption, the fall-back to plain steps); on a CUDA
GPU (TRTBUILD_TEST_DEVICE=cuda, benchmarks/gpu_run.sh) the same tests run the graphs with the device-side gather.
"""

from __future__ import annotations

import pytest

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.util.errors import InputError

PROMPTS = [[1, 5, 9, 33, 7], [1, 8, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 2], [1, 40, 41],
           [1, 7, 7, 7, 9, 2], [1, 90], [1, 3, 5, 7, 11, 13, 17]]


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine("llama", Limits(max_batch=4, max_input_len=32, max_seq_len=96))[0]


@pytest.fixture(scope="module")
def plain(engine):
    llm = LLM(engine, backend="torch", async_scheduling=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ahead(engine):
    llm = LLM(engine, backend="torch", async_scheduling=True)
    yield llm
    llm.close()


def outcome(outputs) -> list[tuple]:
    return [(tuple(o.token_ids), o.text, o.finish_reason) for o in outputs]


def staggered(**kw) -> list[SamplingParams]:
    """Requests that finish at different steps: 7 prompts on 4 slots, so some join as others leave."""
    return [SamplingParams(max_new_tokens=n, ignore_eos=True, **kw) for n in (1, 9, 4, 12, 2, 7, 5)]


def test_greedy_requests_joining_and_leaving_get_the_plain_loops_tokens(plain, ahead):
    params = staggered(temperature=0.0)
    before = ahead.generator.decoding.ahead_steps
    assert outcome(ahead.generate(prompt_token_ids=PROMPTS, params=params)) == \
        outcome(plain.generate(prompt_token_ids=PROMPTS, params=params))
    assert ahead.generator.decoding.ahead_steps - before >= 10  # the steps did take their ids on the device
    assert ahead.backend.kv.num_free == ahead.backend.kv.batch_slots  # every slot back, the dropped rows' too


def test_seeded_sampling_gets_the_plain_loops_draws(plain, ahead):
    params = [SamplingParams(max_new_tokens=n, ignore_eos=True, temperature=0.9, top_k=20, top_p=0.95, seed=s)
              for s, n in enumerate((3, 10, 6, 8))]
    assert outcome(ahead.generate(prompt_token_ids=PROMPTS[:4], params=params)) == \
        outcome(plain.generate(prompt_token_ids=PROMPTS[:4], params=params))


def test_a_stop_token_ends_the_request_a_step_late_with_the_same_answer(plain, ahead):
    """The stop is found when the token is accepted, after the next step was launched: that row is dropped."""
    free = plain.generate(prompt_token_ids=[PROMPTS[1]], params=SamplingParams(max_new_tokens=12, temperature=0.0,
                                                                               ignore_eos=True))[0].token_ids
    stop = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=[free[4]])
    got = ahead.generate(prompt_token_ids=[PROMPTS[1], PROMPTS[0]], params=stop)
    assert outcome(got) == outcome(plain.generate(prompt_token_ids=[PROMPTS[1], PROMPTS[0]], params=stop))
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) <= 5


def test_rows_the_device_cannot_sample_alone_fall_back_to_plain_steps(plain, ahead):
    """Logprobs and a repetition penalty read the host: such a step waits for the one in flight, then runs plainly."""
    params = staggered(temperature=0.0)
    params[1] = SamplingParams(max_new_tokens=9, ignore_eos=True, temperature=0.0, logprobs=2)
    params[3] = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.0, repetition_penalty=1.3)
    got = ahead.generate(prompt_token_ids=PROMPTS, params=params)
    assert outcome(got) == outcome(plain.generate(prompt_token_ids=PROMPTS, params=params))
    assert [lp.token_id for lp in got[1].logprobs] == list(got[1].token_ids)


def test_a_fall_back_mid_run_counts_each_step_once(plain, ahead):
    """The last request asks for logprobs and joins while launched steps run ahead: the step in flight is accepted
    (its tokens counted, not as a step of its own), then plain steps. Timings count the steps the backend ran."""
    params = staggered(temperature=0.0)
    params[6] = SamplingParams(max_new_tokens=5, ignore_eos=True, temperature=0.0, logprobs=1)
    forward, decode_steps = ahead.backend.forward, []

    def counting(batch):  # the prompts are 2..14 tokens: a step of one token a row is a decode step
        decode_steps.append(batch.num_tokens == batch.num_seqs)
        return forward(batch)

    ahead.backend.forward = counting
    try:
        got = ahead.generate(prompt_token_ids=PROMPTS, params=params)
    finally:
        ahead.backend.forward = forward
    assert outcome(got) == outcome(plain.generate(prompt_token_ids=PROMPTS, params=params))
    timings = ahead.last_timings
    assert timings.decode_steps == sum(decode_steps)
    assert timings.decode_tokens == sum(len(o.token_ids) - 1 for o in got)  # each one's first token: its prefill's


def test_preempted_requests_resume_with_the_same_greedy_tokens(engine, plain):
    per_block = plain.backend.kv.pool.nbytes // plain.backend.kv.pool.num_blocks
    tight = LLM(engine, backend="torch", async_scheduling=True, kv_cache_memory=8 * per_block)  # 7 blocks + scratch
    try:
        prompts = [[1, *range(10 + i, 40 + i)] for i in range(4)]  # 31 tokens: 2 blocks each, growing to 4
        params = SamplingParams(max_new_tokens=30, ignore_eos=True, temperature=0.0)
        got = outcome(tight.generate(prompt_token_ids=prompts, params=params))
        assert tight.generator.admission.scheduler.resumes.preemptions > 0
        assert got == outcome(plain.generate(prompt_token_ids=prompts, params=params))
    finally:
        tight.close()


def test_by_default_async_scheduling_runs_on_a_gpu_only(engine, plain):
    from engine_builder.runner.async_decode import AsyncDecode
    from engine_builder.runner.generate import PlainDecode

    llm = LLM(engine, backend="torch")
    try:
        gpu = llm.backend.device.type == "cuda"
        assert isinstance(llm.generator.decoding, AsyncDecode if gpu else PlainDecode)
    finally:
        llm.close()
    assert isinstance(plain.generator.decoding, PlainDecode)  # async_scheduling=False: never
    speculative = LLM(engine, backend="torch", speculative="ngram")  # the default gives way to speculation
    try:
        assert not isinstance(speculative.generator.decoding, AsyncDecode)
    finally:
        speculative.close()
    twin = LLM(engine, backend="onnxruntime")  # a host backend: off, no refusal
    try:
        assert isinstance(twin.generator.decoding, PlainDecode)
    finally:
        twin.close()


def test_async_scheduling_is_refused_where_it_cannot_run(engine):
    with pytest.raises(InputError, match="backend torch"):
        LLM(engine, backend="onnxruntime", async_scheduling=True)
    with pytest.raises(InputError, match="speculative"):
        LLM(engine, backend="torch", async_scheduling=True, speculative="ngram")


def test_the_executor_streams_the_plain_tokens_and_a_cancel_frees_the_slot(plain, ahead):
    """The server's loop: requests arriving while others decode, one cancelled mid-way (its in-flight row dropped)."""
    from engine_builder.executor import Executor

    params = staggered(temperature=0.0)
    want = [o.token_ids for o in plain.generate(prompt_token_ids=PROMPTS, params=params)]
    long = SamplingParams(max_new_tokens=60, ignore_eos=True, temperature=0.0)
    with Executor(ahead) as executor:
        cancelled = executor.submit(PROMPTS[0], long)
        first = next(iter(cancelled.events(timeout=60)))
        handles = [executor.submit(p, s) for p, s in zip(PROMPTS, params)]
        cancelled.cancel()
        assert [h.result(timeout=120).token_ids for h in handles] == want
        out = cancelled.result(timeout=60)
        assert out.finish_reason == "cancelled" and first.token_id == out.token_ids[0] and len(out.token_ids) < 60
        assert executor.stats().free_slots == ahead.backend.kv.batch_slots
