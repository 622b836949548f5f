"""Speculative decoding through LLM on real onnxruntime sessions: greedy output identical to plain decoding
for both proposers on two tiny architectures and on SmolLM2; streaming, stop strings and max_new_tokens as
without it; the sampled distribution equal to the target's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine_builder import LLM, SamplingParams
from engine_builder.runner.sampler import Sampler, SamplingState
from engine_builder.runner.speculative import SpeculativeConfig
from engine_builder.runner.speculative.acceptance import probabilities, verify_token
from engine_builder.runner.speculative.ngram import lookup
from engine_builder.util.errors import InputError, UnsupportedError

GREEDY = SamplingParams(max_new_tokens=40, temperature=0, logprobs=1)
# repetitive prompts: prompt lookup finds continuations in them, and random models loop back into them
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7], [30, 31, 32, 33, 30, 31, 32, 33, 30, 31]]


def _same(got, want) -> None:
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    for g, w in zip(got, want):  # same positions, same raw logits: the logprobs agree to float noise
        np.testing.assert_allclose([lp.logprob for lp in g.logprobs], [lp.logprob for lp in w.logprobs], atol=1e-4)


@pytest.mark.parametrize("arch,draft_arch", [("llama", "qwen3"), ("qwen3", "llama")])
def test_greedy_tokens_identical_for_both_proposers(tiny_engine, arch, draft_arch):
    engine, _ = tiny_engine(arch)
    draft, _ = tiny_engine(draft_arch)  # another random model with the same word tokenizer: poor drafts
    want = LLM(engine).generate(prompt_token_ids=PROMPTS, params=GREEDY)
    configs = [SpeculativeConfig("ngram", num_draft_tokens=4), SpeculativeConfig("ngram"),
               SpeculativeConfig("draft", draft_engine=str(draft), num_draft_tokens=3),
               SpeculativeConfig("draft", draft_engine=str(engine))]  # drafting for itself: all accepted
    for config in configs:
        llm = LLM(engine, speculative=config)
        _same(llm.generate(prompt_token_ids=PROMPTS, params=GREEDY), want)
        stats = llm.speculation.stats
        assert stats.verify_steps > 0 and stats.draft_tokens >= stats.accepted_tokens
        if config.num_draft_tokens:  # both prompts draft at once: one engine step verifies them together
            assert stats.batched_verify_steps > 0
        if config.draft_engine == str(engine):
            assert stats.acceptance_rate == 1.0 and stats.mean_accepted_length > 2


def test_beam_search_beside_speculative_requests_is_as_without(tiny_engine):
    """A beam search's rows ride in the plain step of a speculative generator (nothing to verify); the drafted
    request beside it and the beams answer as without speculation."""
    engine, _ = tiny_engine("llama")
    beams = SamplingParams(max_new_tokens=12, temperature=0, num_beams=2)
    want = LLM(engine).generate(prompt_token_ids=PROMPTS, params=[GREEDY, beams])
    llm = LLM(engine, speculative=SpeculativeConfig("draft", draft_engine=str(engine)))
    got = llm.generate(prompt_token_ids=PROMPTS, params=[GREEDY, beams])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert llm.speculation.stats.verify_steps > 0 and llm.speculation.stats.plain_steps > 0
    assert llm.backend.kv.num_free == llm.backend.kv.batch_slots


def test_streaming_stop_strings_and_max_tokens_as_without(tiny_engine):
    engine, _ = tiny_engine("llama")
    plain, spec = LLM(engine), LLM(engine, speculative=SpeculativeConfig("ngram", num_draft_tokens=6))
    full = plain.generate(prompt_token_ids=PROMPTS[:1], params=GREEDY)[0].text.split()
    stop = " ".join(full[9:11])  # two words in the middle: several tokens, possibly inside a verified run
    for params in (SamplingParams(max_new_tokens=n, temperature=0) for n in (1, 2, 7, 23)):
        _same_stream(plain, spec, PROMPTS[0], params)
    _same_stream(plain, spec, PROMPTS[0], SamplingParams(max_new_tokens=40, temperature=0, stop=(stop,)))
    assert spec.speculation.stats.verify_steps > 0


def _same_stream(plain: LLM, spec: LLM, ids: list[int], params: SamplingParams) -> None:
    text = plain.tokenizer.decode(ids)
    outputs = []
    for llm in (plain, spec):
        with llm.stream(text, params) as stream:
            deltas = list(stream)
        assert "".join(deltas) == stream.output.text
        outputs.append(stream.output)
    assert outputs[1] == outputs[0]


def test_smollm2_greedy_identical_with_ngram_and_draft(smollm2_engine, smollm2_gqa_engine):
    """The real model on a copy task: the same tokens, and most drafts accepted."""
    text = ("Repeat the following paragraph exactly, word for word:\n\nThe old lighthouse stood on the northern "
            "cliff for two hundred years. Every night its keeper climbed the narrow stairs, polished the great lens "
            "and lit the lamp.")
    params = SamplingParams(max_new_tokens=32, temperature=0)
    want = LLM(smollm2_engine).chat([{"role": "user", "content": text}], params)
    ngram = LLM(smollm2_engine, speculative="ngram")
    assert [o.token_ids for o in ngram.chat([{"role": "user", "content": text}], params)] == [want[0].token_ids]
    assert ngram.speculation.stats.accepted_tokens > 8
    # the GroupQueryAttention graph of the same model drafts for the default graph: same tokenizer
    draft = LLM(smollm2_engine, speculative=SpeculativeConfig("draft", draft_engine=str(smollm2_gqa_engine)))
    assert [o.token_ids for o in draft.chat([{"role": "user", "content": text}], params)] == [want[0].token_ids]
    assert draft.speculation.stats.acceptance_rate > 0.8


def test_sampled_distribution_equals_the_targets(tiny_engine):
    """Many seeds: the first verified token (the second generated) follows the target's marginal
    sum_t1 p(t1) p(t2 | t1), drafts from another model partly accepted; a chi-square test over the likely
    tokens (expected count >= 5 each) and one bucket for the rest. The first token is checked the same way."""
    engine, _ = tiny_engine("llama")
    draft, _ = tiny_engine("qwen3")
    prompt = PROMPTS[0]
    params = SamplingParams(max_new_tokens=2, temperature=0.1)  # random tiny models are near uniform at 1.0
    target = LLM(engine)
    first = _target_probs(target, prompt, params)
    second = sum(first[t1] * _target_probs(target, prompt + [t1], params) for t1 in range(first.size))
    n = 800
    spec = LLM(engine, speculative=SpeculativeConfig("draft", draft_engine=str(draft), num_draft_tokens=1))
    outs = spec.generate(prompt_token_ids=[prompt] * n,
                         params=[dataclasses.replace(params, seed=s) for s in range(n)])
    stats = spec.speculation.stats
    pairs = [o.token_ids for o in outs if len(o.token_ids) == 2]  # not those whose first token was EOS
    assert stats.verify_steps == len(pairs) > 0.95 * n  # every second token went through the rejection rule
    assert 30 < stats.accepted_tokens < stats.verify_steps - 30  # drafts kept, and drafts corrected
    _chi_square_ok([o.token_ids[0] for o in outs], first)
    eos = 2
    second = second.copy()
    second[eos] += first[eos]  # a request that stopped at EOS counts as EOS again: the marginal stays whole
    _chi_square_ok([o.token_ids[1] if len(o.token_ids) == 2 else eos for o in outs], second)


def _chi_square_ok(tokens: list[int], p: np.ndarray) -> None:
    n = len(tokens)
    counts = np.bincount(tokens, minlength=p.size)
    likely = np.flatnonzero(n * p >= 5)
    observed = [*counts[likely], n - counts[likely].sum()]
    expected = [*(n * p[likely]), n * (1 - p[likely].sum())]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected) if e > 0)
    df = len(observed) - 1
    # the chi-square quantile at p = 0.001 (Wilson-Hilferty: z = 3.09), so a correct sampler fails 1 in 1000
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    assert df >= 5 and chi2 < critical, (chi2, critical, df)


def _target_probs(llm: LLM, ids: list[int], params: SamplingParams) -> np.ndarray:
    backend = llm.backend
    slot = backend.kv.allocate("probe", len(ids), 1)
    try:
        logits = backend.step(slot, np.array([ids])).copy()
    finally:
        backend.release(slot)
    return probabilities(Sampler().process(logits, [SamplingState(params, ids, backend.vocab_size)])[0])


def test_rejection_rule_keeps_the_target_distribution():
    """verify_token alone, many draws: emitted tokens follow p for a one-hot q (ngram) and for a drafted q."""
    rng = np.random.default_rng(0)
    p_logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    p = probabilities(p_logits)
    q = np.array([0.1, 0.2, 0.3, 0.4])
    n = 8000
    for probs in (None, q):
        counts = np.zeros(4)
        for _ in range(n):
            draft = 3 if probs is None else int(rng.choice(4, p=q))
            token, _ = verify_token(p_logits, draft, probs, greedy=False, rng=rng)
            counts[token] += 1
        chi2 = float((((counts - n * p) ** 2) / (n * p)).sum())
        assert chi2 < 16.27  # 3 degrees of freedom, p = 0.001


def test_ngram_lookup():
    assert lookup([1, 2, 3, 4, 1, 2], 3).tokens == (3, 4, 1)  # suffix [1, 2] found at the start
    assert lookup([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 2).tokens == (9, 2)  # longest suffix [1, 2, 3] first
    assert lookup([5, 6, 7], 4).tokens == ()


def test_bad_speculative_settings_are_one_line_errors(tiny_engine, tmp_path):
    engine, _ = tiny_engine("llama")
    with pytest.raises(InputError, match="--draft-engine"):
        SpeculativeConfig("draft")
    with pytest.raises(InputError, match="not one of ngram, draft"):
        LLM(engine, speculative="medusa")
    with pytest.raises(InputError, match="not an engine dir"):
        SpeculativeConfig("draft", draft_engine=str(tmp_path))
    with pytest.raises(InputError, match="num-draft-tokens must be a positive integer"):
        SpeculativeConfig("ngram", num_draft_tokens=0)


def test_an_engine_without_logits_tail_is_refused(tiny_engine, tmp_path):
    """A graph that returns the last position's logits only cannot verify: say so, and how to rebuild."""
    from engine_builder.build.pipeline import build
    from engine_builder.formats.build_config import BuildConfig, Limits

    engine, _ = tiny_engine("llama")
    out = tmp_path / "last-only"
    build(engine.parent / "ckpt", out, BuildConfig(targets=("onnxruntime",), dtype="float32", logits_tail=1,
                                                   limits=Limits(max_batch=2, max_input_len=32, max_seq_len=96)))
    with pytest.raises(UnsupportedError, match="rebuild it"):
        LLM(out, speculative="ngram")


def test_the_executor_drives_a_speculative_generator(tiny_engine):
    """In-flight batching over LLM(..., speculative=...): drafted requests verify together, rows without drafts
    decode together, chunked prefill rides along; every request's tokens equal plain greedy."""
    from engine_builder.executor import Executor, SchedulerConfig

    engine, _ = tiny_engine("llama")
    want = LLM(engine).generate(prompt_token_ids=PROMPTS, params=GREEDY)
    llm = LLM(engine, speculative=SpeculativeConfig("ngram", num_draft_tokens=3))
    with Executor(llm, SchedulerConfig(max_tokens_per_step=8)) as executor:
        handles = [executor.submit(p, GREEDY) for p in PROMPTS]
        got = [h.result() for h in handles]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert llm.speculation.stats.verify_steps > 0


def test_batched_verify_with_a_free_slot_between_drafting_rows(tiny_engine):
    """Three requests in slots 0, 1, 2; the middle one ends after 2 tokens, so slots 0 and 2 verify together
    across the free slot 1 (it rides along at length 0). Every request's tokens equal plain greedy."""
    from engine_builder.executor import Executor

    engine, _ = tiny_engine("llama")
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][3:]]
    params = [GREEDY, dataclasses.replace(GREEDY, max_new_tokens=2), GREEDY]
    want = LLM(engine).generate(prompt_token_ids=prompts, params=params)
    llm = LLM(engine, speculative=SpeculativeConfig("ngram", num_draft_tokens=4))
    with Executor(llm) as executor:
        handles = [executor.submit(p, sp) for p, sp in zip(prompts, params)]
        got = [h.result() for h in handles]
    _same(got, want)
    assert llm.speculation.stats.batched_verify_steps > 0


def test_decode_timings_count_the_drafting(tiny_engine):
    """`run --json`'s decode tok/s of a speculative run covers the draft model's engine calls, not only the
    verify steps (it read 158-193 tok/s for a story that decoded at ~80)."""
    import time

    engine, _ = tiny_engine("llama")
    llm = LLM(engine, speculative=SpeculativeConfig("draft", draft_engine=str(engine), num_draft_tokens=3))
    draft = llm.speculation.proposer.backend
    before = draft.execute_seconds
    started = time.perf_counter()
    llm.generate(prompt_token_ids=PROMPTS[:1], params=GREEDY)
    wall = time.perf_counter() - started
    t, drafting = llm.last_timings, draft.execute_seconds - before
    assert drafting > 0
    # the engine time counted is the target's verify calls and the draft's calls during decode (its prompt
    # feed in the first proposal included); decode time holds it, within the wall time of the call
    assert t.execute_seconds >= drafting
    assert t.execute_seconds <= t.decode_seconds <= wall
