"""Sampler vs HF transformers' own logits processors, determinism, and sampling statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine_builder.runner.sampler import Sampler, SamplingState
from engine_builder.runner.sampling_params import SamplingParams

VOCAB = 1000


def _logits(batch: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((batch, VOCAB)) * scale).astype(np.float32)  # [batch, vocab]


def _contexts(batch: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, size=(batch, 40))  # [batch, ctx] prompt + generated


def _states(params: list[SamplingParams], ctx: np.ndarray, n_generated: int = 0) -> list[SamplingState]:
    states = []
    for p, ids in zip(params, ctx):
        s = SamplingState(p, ids[:len(ids) - n_generated], VOCAB)
        for t in ids[len(ids) - n_generated:]:
            s.append(t)
        states.append(s)
    return states


def _hf(processors, ctx: np.ndarray, logits: np.ndarray) -> np.ndarray:
    out = LogitsProcessorList(processors)(torch.from_numpy(ctx), torch.from_numpy(logits.copy()))
    return out.numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    return torch.softmax(torch.from_numpy(x), dim=-1).numpy()


# SamplingParams() leaves temperature to the engine's generation_config.json (greedy without one): a
# sampling case names its temperature, as a vLLM user's temperature=1.0 default would
CASES = {
    # temperature 0: greedy rows are only penalized, so the penalty is seen in isolation
    "repetition_penalty": (dict(temperature=0.0, repetition_penalty=1.3),
                           lambda: [RepetitionPenaltyLogitsProcessor(1.3)]),
    "repetition_reward": (dict(temperature=0.0, repetition_penalty=0.7),
                          lambda: [RepetitionPenaltyLogitsProcessor(0.7)]),
    "temperature": (dict(temperature=0.7), lambda: [TemperatureLogitsWarper(0.7)]),
    "top_k": (dict(temperature=1.0, top_k=20), lambda: [TopKLogitsWarper(20)]),
    "top_p": (dict(temperature=1.0, top_p=0.8), lambda: [TopPLogitsWarper(0.8)]),
    "min_p": (dict(temperature=1.0, min_p=0.05), lambda: [MinPLogitsWarper(0.05)]),
    "all": (dict(repetition_penalty=1.2, temperature=0.6, top_k=50, top_p=0.9, min_p=0.02),
            lambda: [RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.6), TopKLogitsWarper(50),
                     TopPLogitsWarper(0.9), MinPLogitsWarper(0.02)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_processed_logits_match_hf(case):
    kwargs, hf_processors = CASES[case]
    logits, ctx = _logits(4), _contexts(4)
    ours = Sampler().process(logits, _states([SamplingParams(**kwargs)] * 4, ctx))
    theirs = _hf(hf_processors(), ctx, logits)
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))  # same tokens filtered
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_softmax(ours), _softmax(theirs), rtol=1e-5, atol=1e-7)
    assert not np.array_equal(ours, logits)  # each case really changes something


def test_each_row_gets_its_own_params_like_separate_hf_runs():
    rows = [
        (dict(temperature=0.0, repetition_penalty=1.5), [RepetitionPenaltyLogitsProcessor(1.5)]),
        (dict(temperature=1.3, top_k=5), [TemperatureLogitsWarper(1.3), TopKLogitsWarper(5)]),
        (dict(temperature=0.5, top_p=0.5, min_p=0.1), [TemperatureLogitsWarper(0.5), TopPLogitsWarper(0.5),
                                                         MinPLogitsWarper(0.1)]),
        (dict(temperature=1.0, repetition_penalty=1.1, top_k=100, top_p=0.95), [RepetitionPenaltyLogitsProcessor(1.1),
                                                                TopKLogitsWarper(100), TopPLogitsWarper(0.95)]),
    ]
    logits, ctx = _logits(4, seed=5), _contexts(4, seed=6)
    ours = Sampler().process(logits, _states([SamplingParams(**kw) for kw, _ in rows], ctx))
    for i, (_, hf_processors) in enumerate(rows):
        theirs = _hf(hf_processors, ctx[i:i + 1], logits[i:i + 1])[0]
        np.testing.assert_allclose(ours[i], theirs, rtol=1e-6, atol=1e-6, err_msg=f"row {i}")


def test_presence_and_frequency_penalties_use_openai_formula_on_generated_ids_only():
    logits, ctx = _logits(1), _contexts(1)
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3)
    n_gen = 10
    ctx[0, -n_gen:] = [7, 7, 7, 9, 9, 11, 12, 13, 14, 15]
    ctx[0, :-n_gen] = 500  # a prompt token: must not be penalized
    ours = Sampler().process(logits, _states([params], ctx, n_generated=n_gen))
    expected = logits.copy()
    for token in set(ctx[0, -n_gen:].tolist()):
        count = ctx[0, -n_gen:].tolist().count(token)
        expected[0, token] -= count * 0.3 + 0.5
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    assert ours[0, 500] == logits[0, 500]


@pytest.mark.parametrize("seed", range(5))
def test_top_k_1_equals_greedy(seed):
    logits, ctx = _logits(4, seed=seed), _contexts(4, seed=seed)
    sampler = Sampler(seed=seed)
    greedy = sampler(logits, _states([SamplingParams(temperature=0.0, repetition_penalty=1.3)] * 4, ctx))
    top1 = sampler(logits, _states([SamplingParams(temperature=0.8, top_k=1, repetition_penalty=1.3)] * 4, ctx))
    np.testing.assert_array_equal(greedy.token_ids, top1.token_ids)
    # the penalty matters: without it argmax of the raw logits is not always the answer
    penalized = Sampler().process(logits, _states([SamplingParams(temperature=0.0, repetition_penalty=1.3)] * 4, ctx))
    np.testing.assert_array_equal(greedy.token_ids, penalized.argmax(-1))


def _draw(params: list[SamplingParams], steps: int, logits_seed: int, sampler_seed: int | None = None) -> np.ndarray:
    """Run `steps` sampling steps with fresh random logits each step; tokens [steps, batch]."""
    sampler = Sampler(seed=sampler_seed)
    states = [SamplingState(p, [1, 2, 3], VOCAB) for p in params]
    rng = np.random.default_rng(logits_seed)
    out = []
    for _ in range(steps):
        logits = (rng.standard_normal((len(params), VOCAB)) * 2).astype(np.float32)
        tokens = sampler(logits, states).token_ids
        for s, t in zip(states, tokens):
            s.append(t)
        out.append(tokens)
    return np.array(out)


def test_fixed_seed_is_reproducible_and_seed_matters():
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=123)]
    a = _draw(params, 30, logits_seed=0)
    b = _draw(params, 30, logits_seed=0, sampler_seed=999)  # the sampler's own seed must not matter
    c = _draw([SamplingParams(temperature=1.0, top_p=0.95, seed=124)], 30, logits_seed=0)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a[:, 0].tolist())) > 5  # it really sampled, not argmax


def test_seeded_row_is_identical_alone_and_in_a_batch():
    seeded = SamplingParams(temperature=0.9, top_p=0.97, repetition_penalty=1.1, seed=7)
    steps = 40
    # the seeded row's logits must be the same in both runs: draw them per step, row by row
    rng = np.random.default_rng(42)
    row_logits = (rng.standard_normal((steps, 4, VOCAB)) * 2).astype(np.float32)

    def run(params, rows):
        sampler = Sampler(seed=11)
        states = [SamplingState(p, [5, 6, 7], VOCAB) for p in params]
        out = []
        for t in range(steps):
            tokens = sampler(row_logits[t, rows], states).token_ids
            for s, tok in zip(states, tokens):
                s.append(tok)
            out.append(tokens)
        return np.array(out)  # [steps, batch]

    alone = run([seeded], [2])[:, 0]
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5, top_k=10),
              SamplingParams(temperature=0.7, min_p=0.1, seed=99)]
    batched = run([others[0], others[1], seeded, others[2]], [0, 1, 2, 3])[:, 2]
    np.testing.assert_array_equal(alone, batched)
    assert len(set(alone.tolist())) > 10


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_temperature_sampling_frequencies_follow_the_tempered_softmax():
    base = np.array([2.0, 1.0, 0.5, 0.0, -1.0], dtype=np.float32)
    n = 20000
    params = SamplingParams(temperature=0.7)
    states = [SamplingState(params, [0], 5) for _ in range(n)]
    tokens = Sampler(seed=2024)(np.tile(base, (n, 1)), states).token_ids  # seeded: cannot flake
    counts = np.bincount(tokens, minlength=5).astype(np.float64)
    tempered = _softmax(base / 0.7)
    # 18.47 = chi-square critical value for 4 degrees of freedom at p = 0.001
    assert _chi_square(counts, tempered) < 18.47
    assert _chi_square(counts, _softmax(base)) > 100  # the check can tell T=0.7 from T=1


def test_sampling_never_leaves_the_top_k_and_keeps_their_ratio():
    base = np.array([3.0, 2.5, 2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    n = 20000
    states = [SamplingState(SamplingParams(temperature=1.0, top_k=2), [0], 6) for _ in range(n)]
    tokens = Sampler(seed=7)(np.tile(base, (n, 1)), states).token_ids
    assert set(tokens.tolist()) == {0, 1}
    counts = np.bincount(tokens, minlength=2).astype(np.float64)
    assert _chi_square(counts, _softmax(base[:2])) < 10.83  # 1 dof, p = 0.001


def test_raw_logprobs_ignore_penalties_and_temperature():
    logits, ctx = _logits(2, seed=3), _contexts(2, seed=3)
    params = [SamplingParams(temperature=0.3, repetition_penalty=1.5, logprobs=5, seed=1),
              SamplingParams(temperature=0.0, logprobs=0)]
    out = Sampler()(logits, _states(params, ctx))
    reference = torch.log_softmax(torch.from_numpy(logits), dim=-1).numpy()  # [batch, vocab]
    for row, lp in enumerate(out.logprobs):
        assert lp.token_id == out.token_ids[row]
        assert lp.logprob == pytest.approx(reference[row, lp.token_id], abs=1e-5)
        assert lp.rank == int((reference[row] > reference[row, lp.token_id]).sum()) + 1
    top_vals, top_ids = torch.topk(torch.from_numpy(reference[0]), 5)
    assert [t for t, _ in out.logprobs[0].top] == top_ids.tolist()
    np.testing.assert_allclose([v for _, v in out.logprobs[0].top], top_vals.numpy(), atol=1e-5)
    assert out.logprobs[1].top == () and out.logprobs[1].rank == 1  # greedy, no penalty: the argmax


def test_processed_logprobs_are_those_sampled_from():
    logits, ctx = _logits(1, seed=4), _contexts(1, seed=4)
    params = SamplingParams(temperature=0.5, top_k=3, logprobs=4, seed=2)
    out = Sampler(logprobs_mode="processed")(logits, _states([params], ctx))
    hf = _hf([TemperatureLogitsWarper(0.5), TopKLogitsWarper(3)], ctx, logits)
    reference = torch.log_softmax(torch.from_numpy(hf), dim=-1).numpy()[0]
    lp = out.logprobs[0]
    assert lp.logprob == pytest.approx(reference[lp.token_id], abs=1e-5)
    assert [v for _, v in lp.top][3] == -np.inf  # only 3 tokens survive top_k
    np.testing.assert_allclose(sorted(np.exp([v for _, v in lp.top[:3]])), sorted(np.exp(np.sort(reference)[-3:])),
                               atol=1e-6)


def test_no_logprobs_unless_asked():
    out = Sampler()(_logits(2), _states([SamplingParams(), SamplingParams(logprobs=2)], _contexts(2)))
    assert out.logprobs[0] is None and len(out.logprobs[1].top) == 2
