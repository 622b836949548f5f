"""How long ngram drafts are: the longest suffix match wins, one shared token proposes nothing, the draft
length follows the acceptance rate of proposals with the same match length, and a batched verify step
takes the rows without drafts along (runner/speculative/)."""

from __future__ import annotations

import numpy as np

from engine_builder import LLM, SamplingParams
from engine_builder.runner.speculative import SpeculativeConfig
from engine_builder.runner.speculative.draft_length import DraftLength, StepCosts
from engine_builder.runner.speculative.ngram import lookup

GREEDY = SamplingParams(max_new_tokens=40, temperature=0, logprobs=1)
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7], [30, 31, 32, 33, 30, 31, 32, 33, 30, 31]]


def test_the_longest_match_wins_and_is_reported():
    # suffix [7, 8, 9]: matched 3 long at the start, only [8, 9] (2 long) at the more recent place
    context = [7, 8, 9, 1, 2, 8, 9, 3, 4, 7, 8, 9]
    proposal = lookup(context, 2)
    assert proposal.tokens == (1, 2) and proposal.match == 3
    assert lookup([4, 5, 6, 4, 5, 7, 4, 5], 2).tokens == (7, 4)  # equally long: the latest with 2 tokens after
    assert lookup([4, 5, 6, 4, 5], 3).tokens == (6, 4, 5)
    assert lookup([1, 2, 3, 1], 2).tokens == ()  # one shared token: no proposal at the default ngram_min 2
    assert lookup([1, 2, 3, 1], 2, ngram_min=1).tokens == (2, 3)
    assert lookup(list(range(20)) + list(range(12)), 4, ngram_max=8).match == 8  # capped at ngram_max


def test_draft_length_follows_the_acceptance_of_its_match_length():
    costs = StepCosts(t1=0.04, slope=0.004)  # a 16-token verify step costs 2.5 plain steps
    control = DraftLength(cap=15, adaptive=True)
    for _ in range(6):
        control.observe(4, 0, match=2)  # 2-token matches: always wrong
        control.observe(12, 12, match=9)  # long matches: always right
    assert control.choose(costs, 15, match=2) == 0  # a plain step beats drafting on a short match
    assert control.choose(costs, 15, match=9) == 15
    assert control.choose(costs, 15, match=3) == 2  # no history for 3-token matches: the prior alpha 0.5
    for _ in range(6):
        control.observe(6, 6, match=3)
    assert control.choose(costs, 15, match=3) == 6  # right every time, but at most 2 drafts per matched token
    assert control.choose(costs, 4, match=9) == 4  # never past the room left


def test_draft_length_follows_where_drafts_fail_not_only_how_often():
    """Drafts whose rejections cluster (how a model draft diverges) are judged per draft position: the expected
    tokens of a verify step follow what was observed, where one survival rate per token (geometric) does not."""
    costs = StepCosts(t1=0.04, slope=0.004, draft_token=0.015)
    always_four = DraftLength(cap=12, adaptive=True)
    for _ in range(20):
        always_four.observe(8, 4)  # the first 4 drafts right, the 5th wrong, every time
    alpha = always_four.alpha()
    geometric = [(1 - alpha ** (k + 1)) / (1 - alpha) / (costs.verify(k + 1) + costs.drafting(k)) for k in range(13)]
    geometric[0] = 1 / costs.t1
    assert max(range(13), key=geometric.__getitem__) <= 2  # alpha ~0.8 alone: short drafts
    assert always_four.choose(costs, 12) == 4  # what pays: the 4 that survive, not a 5th
    tokens = [always_four.expected_tokens(k) for k in range(6)]
    assert 4.5 < tokens[4] < 5.0 and tokens[5] - tokens[4] < 0.2

    all_or_nothing = DraftLength(cap=8, adaptive=True)
    for _ in range(10):
        all_or_nothing.observe(8, 8)
        all_or_nothing.observe(8, 0)
    # the first draft survives half the time (a little more: shrunk toward alpha ~0.87); geometric says 1 + alpha
    assert 1.5 < all_or_nothing.expected_tokens(1) < 1.6 < 1 + all_or_nothing.alpha()
    successor = all_or_nothing.successor()  # the next request starts from these counts, as copies
    assert successor.expected_tokens(8) == all_or_nothing.expected_tokens(8)
    successor.observe(8, 0)
    assert successor.expected_tokens(8) < all_or_nothing.expected_tokens(8)


def test_draft_length_grows_again_past_a_position_its_drafts_stopped_reaching():
    """One rejection at the 5th draft must not hold the length at 4-5 while every draft survives: steps of 5 never
    judge the 6th position again, so its failure would outlive the evidence (tunables.UNSEEN_FAILURES)."""
    costs = StepCosts(t1=0.04, slope=0.004, draft_token=0.015)
    control = DraftLength(cap=15, adaptive=True)
    for _ in range(10):
        control.observe(15, 15)
    control.observe(15, 5)  # rejected at the 6th draft, then at the 5th
    control.observe(5, 4)
    lengths = []
    for _ in range(8):
        lengths.append(control.choose(costs, 15))
        control.observe(lengths[-1], lengths[-1])  # from now on every draft survives
    assert lengths[0] <= 5 < lengths[1] < lengths[2]  # it tries past the 5th at once, and keeps growing
    assert lengths.index(15) <= 5


def test_adaptive_batched_verify_with_riders_keeps_greedy_tokens(tiny_engine):
    """Four greedy requests at once, adaptive ngram: rows without drafts take their token from the verify step
    (riders), and the batch's drafts are cut to one common width; tokens and logprobs equal plain greedy."""
    from engine_builder.executor import Executor

    engine, _ = tiny_engine("llama")
    prompts = [PROMPTS[0], [40, 41, 42, 43, 44], PROMPTS[1], [50, 61, 72, 83]]
    want = LLM(engine).generate(prompt_token_ids=prompts, params=GREEDY)
    llm = LLM(engine, speculative=SpeculativeConfig("ngram"))
    with Executor(llm) as executor:
        got = [h.result() for h in [executor.submit(p, GREEDY) for p in prompts]]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose([lp.logprob for lp in g.logprobs], [lp.logprob for lp in w.logprobs], atol=1e-4)
    assert llm.speculation.stats.batched_verify_steps > 0
