"""TorchSampler (runner/torch_backend/device_sampler.py) against the numpy Sampler, on CPU tensors (CI has no GPU; the
code is device-agnostic): the same tokens for greedy, seeded sampling, penalized, biased and grammar rows, the
same logprobs, and a fast path that is one argmax.

Where the two may differ: numpy's float32 cumsum is sequential and drifts from the exact CDF by up to vocab *
2^-24 of the total (torch's CPU cumsum, a double accumulator, stays within 2e-8), and exp's last bits differ; so a
draw whose target lies within that drift of a CDF boundary can give a neighbouring token, and a top_p / min_p cut
within rounding of its threshold can fall the other way. Measured over 3000 seeds x 4 steps of rows like ROWS
(60000 draws, vocab 1000): one token differed (its boundary 5.5e-7 of the total from the target) and no cut ever
did; at 49152 vocab with flat logits (std 3) ~6% of draws differ, at 128k ~27% (numpy's drift, not torch's:
torch's token is the exact one in every case). The tests accept a difference only as such a near-tie, checked in
float64 against the rigorous error bound (_cdf_near_tie, _at_a_cut), and, at vocab 1000, only as often as
measured.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from engine_builder.runner.grammar import GrammarCompiler
from engine_builder.runner.sampler import Sampler, SamplingState
from engine_builder.runner.sampling_params import SamplingParams
from engine_builder.runner.torch_backend import device_sampler as torch_sampler
from engine_builder.runner.torch_backend.device_sampler import TorchSampler
from engine_builder.util.errors import InputError

VOCAB = 1000
SEEDS = range(50)
STEPS = 4
# one row of each kind; seed None on row 2 draws from the sampler's own generator (in row order)
ROWS = [
    dict(temperature=0.0),
    dict(temperature=0.9, top_k=40, seed=1),
    dict(temperature=1.2, top_p=0.9),
    dict(temperature=0.7, min_p=0.05, seed=3),
    dict(temperature=1.0, top_k=100, top_p=0.95, min_p=0.02, repetition_penalty=1.2, seed=4),
    # the bias comes before the repetition penalty (it scales the biased logit): ids every 7 meet the context
    dict(temperature=1.1, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1, seed=5,
         logit_bias={**{i: 1.5 for i in range(0, VOCAB, 7)}, 3: 5.0, 7: -100.0}),
]
# a top_p / min_p decision the float32 softmax can round either way flips within this of the parameter
CUT_DELTA = 1e-5


@pytest.fixture(autouse=True)
def one_torch_thread():
    # the CI machine's 2 shared cores: torch's OpenMP pool makes these [6, 1000] ops ~30x slower than one thread
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _params(seed: int, rows: list[dict] = ROWS, **extra) -> list[SamplingParams]:
    # per test seed, other request seeds: each seed is a fresh set of draws
    return [SamplingParams(**{**kw, **extra, "seed": None if kw.get("seed") is None else kw["seed"] + 100 * seed})
            for kw in rows]


def _states(params: list[SamplingParams], prompt: np.ndarray, vocab: int = VOCAB) -> list[SamplingState]:
    return [SamplingState(p, prompt, vocab) for p in params]


def _uniforms(sampler: Sampler, states: list[SamplingState]) -> dict[int, float]:
    """The u each sampling row will draw this step (replayed on copies of the generators, in Sampler's order)."""
    own = copy.deepcopy(sampler._rng)
    return {r: 1.0 - (own if s.rng is None else copy.deepcopy(s.rng)).random()
            for r, s in enumerate(states) if not s.params.greedy}


def _cdf_near_tie(processed: np.ndarray, u: float, a: int, b: int) -> bool:
    """Both tokens are the inverse CDF of u up to float32 error: the exact (float64) target lies within tol of
    each token's exact CDF interval. processed [vocab], numpy's.

    tol: a float32 sum of n positive terms, in any order, is within (n - 1) * 2^-24 of the exact one relative to
    the total (Higham's gamma_{n-1}), numpy's and torch's CDF each, plus an ulp of exp per weight in each."""
    vocab = processed.shape[-1]
    cdf = np.cumsum(np.exp(processed.astype(np.float64) - processed.max()))
    target, tol = u * cdf[-1], (2 * vocab + 4) * 2.0**-24 * cdf[-1]
    return all((cdf[t - 1] if t else 0.0) - tol <= target <= cdf[t] + tol for t in (a, b))


def _at_a_cut(logits: np.ndarray, state: SamplingState, token: int) -> bool:
    """The token's top_p / min_p filter decision flips when the parameter moves by CUT_DELTA: it sits on the
    cut, where float32 rounding of the softmax decides. logits [vocab], raw."""
    for field in ("top_p", "min_p"):
        value = getattr(state.params, field)
        if value in (1.0, 0.0):
            continue
        dropped = set()
        for v in (value * (1 - CUT_DELTA), min(value * (1 + CUT_DELTA), 1.0)):
            s = SamplingState(dataclasses.replace(state.params, **{field: v}), [], state.vocab_size)
            s.seen, s.counts, s.grammar = state.seen, state.counts, state.grammar
            dropped.add(bool(np.isneginf(Sampler().process(logits[None], [s])[0, token])))
        if len(dropped) == 2:
            return True
    return False


def _run(seed: int, params: list[SamplingParams], logprobs_mode: str = "raw", steps: int = STEPS):
    """STEPS steps of both samplers on the same random logits and histories (numpy's tokens appended to both):
    per step (logits, numpy states before the step, numpy's output, torch's output, the rows' u)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, 30)
    ours, theirs = _states(params, prompt), _states(params, prompt)
    numpy_sampler, torch_s = Sampler(seed, logprobs_mode), TorchSampler(seed, logprobs_mode)
    for _ in range(steps):
        logits = (rng.standard_normal((len(params), VOCAB)) * 3).astype(np.float32)  # [batch, vocab]
        u = _uniforms(numpy_sampler, theirs)
        before = copy.deepcopy(theirs)
        expected = numpy_sampler(logits, theirs)
        got = torch_s(torch.from_numpy(logits), ours)
        yield logits, before, expected, got, u
        for s, t in zip(ours, expected.token_ids):
            s.append(t)
        for s, t in zip(theirs, expected.token_ids):
            s.append(t)


def test_processed_logits_equal_numpys():
    flips = 0
    for seed in SEEDS:
        for logits, states, _, _, _ in _run(seed, _params(seed)):
            want = Sampler().process(logits, states)  # [batch, vocab]
            got = TorchSampler().process_on_device(torch.from_numpy(logits), states).numpy()
            finite = np.isfinite(want) & np.isfinite(got)
            np.testing.assert_array_equal(got[finite], want[finite])  # bias, mask, penalties, temperature: exact
            for row, token in np.argwhere(np.isneginf(want) != np.isneginf(got)):
                assert _at_a_cut(logits[row], states[row], token), f"seed {seed} row {row} token {token}"
                flips += 1
    assert flips <= 3  # measured: none in 60000 rows


def test_seeded_tokens_equal_numpys():
    differ = draws = 0
    for seed in SEEDS:
        for logits, states, want, got, u in _run(seed, _params(seed)):
            assert got.token_ids.dtype == np.int64 and got.token_ids.shape == (len(ROWS),)
            processed = Sampler().process(logits, states)
            np.testing.assert_array_equal(got.token_ids[0], want.token_ids[0])  # greedy: the argmax, exactly
            draws += len(u)
            for row in np.flatnonzero(got.token_ids != want.token_ids):
                a, b = int(want.token_ids[row]), int(got.token_ids[row])
                assert row in u and _cdf_near_tie(processed[row], u[row], a, b), (
                    f"seed {seed} row {row}: numpy {a}, torch {b}, not a CDF rounding near-tie")
                differ += 1
    assert draws == len(SEEDS) * STEPS * 5
    # measured at this vocab: 0.02% of draws (1 in 60000 rows), ~0.2 expected in these 1000
    assert differ <= 3


def test_penalties_and_bias_on_greedy_rows_equal_numpys():
    rows = [dict(temperature=0.0, repetition_penalty=1.5), dict(temperature=0.0, repetition_penalty=0.7),
            dict(temperature=0.0, presence_penalty=1.5, frequency_penalty=2.0),
            dict(temperature=0.0, logit_bias={5: 100.0}),
            dict(temperature=0.0, logit_bias={i: -100.0 for i in range(0, VOCAB, 2)}),
            # the vocabulary's last id is biased like any other; all meet the repetition penalty after the bias
            dict(temperature=0.0, repetition_penalty=1.3, presence_penalty=-1.0,
                 logit_bias={VOCAB - 1: 3.0, **{i: 2.0 for i in range(1, VOCAB, 5)}})]
    changed = 0
    for seed in range(10):
        for logits, _, want, got, _ in _run(seed, _params(seed, rows), steps=8):
            np.testing.assert_array_equal(got.token_ids, want.token_ids)
            changed += int((want.token_ids != logits.argmax(-1)).sum())
    assert changed > 50  # the penalties and biases really moved the argmax


def test_a_logit_bias_id_past_the_vocab_is_refused_naming_it_and_the_vocab():
    # both samplers take SamplingState's rows: an id without a logit is refused there (it used to be skipped)
    for token in (VOCAB, VOCAB + 5):
        with pytest.raises(InputError, match=rf"logit_bias token id {token} is past this model's vocabulary of "
                                             rf"{VOCAB} ids \(valid: 0\.\.{VOCAB - 1}\)"):
            SamplingState(SamplingParams(temperature=0.0, logit_bias={3: 1.0, token: 2.0}), [1, 2], VOCAB)
    state = SamplingState(SamplingParams(temperature=0.0, logit_bias={VOCAB - 1: 100.0}), [1, 2], VOCAB)
    logits = torch.zeros((1, VOCAB))
    assert TorchSampler()(logits, [state]).token_ids.tolist() == [VOCAB - 1]


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_equal_numpys(mode):
    ns = [0, 3, 5, 50, 20, 4]  # row 3's min_p keeps fewer than 50: processed top-n holds -inf entries
    for seed in range(20):
        params = [dataclasses.replace(p, logprobs=n) for p, n in zip(_params(seed), ns)]
        for _, _, want, got, _ in _run(seed, params, logprobs_mode=mode):
            for row, (w, g) in enumerate(zip(want.logprobs, got.logprobs)):
                assert g.token_id == w.token_id == want.token_ids[row]
                assert g.logprob == pytest.approx(w.logprob, abs=1e-5) and g.rank == w.rank
                assert len(g.top) == len(w.top) == ns[row]
                np.testing.assert_allclose([v for _, v in g.top], [v for _, v in w.top], atol=1e-5)
                # which of several -inf tokens fill the top-n is arbitrary in both
                assert [t for t, v in g.top if v > -np.inf] == [t for t, v in w.top if v > -np.inf]


def test_fast_path_is_one_argmax_and_nothing_else(monkeypatch):
    def no_upload(*_):
        raise AssertionError("the fast path sent something to the device")

    monkeypatch.setattr(torch_sampler, "_to_device", no_upload)
    logits = torch.from_numpy((np.random.default_rng(0).standard_normal((6, VOCAB)) * 3).astype(np.float32))
    states = _states([SamplingParams(temperature=0.0)] * 5 + [SamplingParams()], np.arange(4))  # None: greedy
    out = TorchSampler()(logits, states)
    assert isinstance(out.token_ids, np.ndarray) and out.token_ids.dtype == np.int64 and out.token_ids.shape == (6,)
    np.testing.assert_array_equal(out.token_ids, logits.argmax(-1).numpy())
    assert out.logprobs == (None,) * 6
    # anything to apply leaves the fast path
    with pytest.raises(AssertionError, match="sent something"):
        TorchSampler()(logits, states[:5] + _states([SamplingParams(temperature=0.0, logprobs=1)], np.arange(4)))


def test_numpy_logits_take_the_numpy_path_and_shapes_are_checked():
    logits = (np.random.default_rng(1).standard_normal((2, VOCAB)) * 3).astype(np.float32)
    params = [SamplingParams(temperature=0.8, seed=9), SamplingParams(temperature=1.0, top_p=0.9, logprobs=2)]
    want = Sampler(seed=3)(logits, _states(params, np.arange(4)))
    got = TorchSampler(seed=3)(logits, _states(params, np.arange(4)))
    np.testing.assert_array_equal(got.token_ids, want.token_ids)
    assert got.logprobs == want.logprobs
    with pytest.raises(ValueError, match="batch=3"):
        TorchSampler()(torch.from_numpy(logits), _states(params + params[:1], np.arange(4)))
    with pytest.raises(ValueError, match="vocab 999"):
        TorchSampler()(torch.from_numpy(logits), _states(params, np.arange(4), vocab=999))


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def test_grammar_rows_only_produce_allowed_tokens_and_equal_numpys(smollm2_tokenizer):
    vocab = len(smollm2_tokenizer)  # 49152, with the real tokenizer's byte-level BPE
    eos = smollm2_tokenizer.eos_token_id
    compiler = GrammarCompiler(smollm2_tokenizer, vocab, eos)
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=11, json_schema=SCHEMA),
              SamplingParams(temperature=0.0, json_schema=SCHEMA),  # greedy under the mask
              SamplingParams(temperature=0.8, seed=12)]  # no grammar: the mask must not touch it
    ours, theirs = _states(params, np.arange(10), vocab), _states(params, np.arange(10), vocab)
    for s, t in zip(ours + theirs, params + params):
        s.grammar = compiler.matcher(t)
    check = [compiler.matcher(p) for p in params[:2]]  # a third copy per grammar row, to ask what it allows
    numpy_sampler, torch_s = Sampler(), TorchSampler()
    rng = np.random.default_rng(0)
    texts: list[list[int]] = [[], []]
    unconstrained = same = 0
    for step in range(60):
        if all(m.done for m in check):
            break
        logits = (rng.standard_normal((3, vocab)) * 3).astype(np.float32)  # [3, vocab]
        allowed = [m.allowed() for m in check]
        u = _uniforms(numpy_sampler, theirs)
        processed = numpy_sampler.process(logits, theirs)
        want = numpy_sampler(logits, theirs).token_ids
        got = torch_s(torch.from_numpy(logits), ours).token_ids
        assert got[1] == want[1]  # greedy under the mask: the argmax, exactly
        for row in (0, 2):  # at this vocab numpy's CDF drift is ~1e-5 of the total: near-ties happen
            assert got[row] == want[row] or _cdf_near_tie(processed[row], u[row], want[row], got[row]), (
                f"step {step} row {row}: numpy {want[row]}, torch {got[row]}, not a CDF rounding near-tie")
        same += int((got == want).all())
        for row in (0, 1):
            if check[row].done:  # finished first: the sampler ends it with EOS
                assert got[row] == eos
                continue
            assert allowed[row][got[row]], f"row {row}: token {got[row]} is outside the grammar"
            check[row].accept(want[row])
            texts[row].append(int(want[row]))
        unconstrained += int(not allowed[0][got[2]])
        for s, t in zip(ours, want):  # one history for both (numpy's): a near-tie must not fork the grammars
            s.append(t)
        for s, t in zip(theirs, want):
            s.append(t)
    assert all(m.done for m in check), "the grammar rows should have finished their JSON"
    assert same >= step * 3 // 4  # most steps agree on every row
    for ids in texts:  # the output is the schema's JSON (up to EOS)
        obj = json.loads(smollm2_tokenizer.decode([t for t in ids if t != eos]))
        assert set(obj) == {"name", "age"}
    assert unconstrained > 0  # row 2 went where the grammar would not have
