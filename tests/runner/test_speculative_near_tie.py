"""A greedy draft ends its proposal at a near tie (its two best logits within stop_margin) while near-tie drafts
keep failing verification, and drafts the whole length asked for once they survive (runner/speculative/draft.py):
a real onnxruntime session of a tiny Llama, whose random logits make every draft a near tie at a huge margin."""

from __future__ import annotations

from types import SimpleNamespace

from engine_builder import LLM, SamplingParams
from engine_builder.runner.speculative.draft import DraftProposer


def test_the_draft_stops_at_near_ties_only_while_they_fail(tiny_engine):
    engine, _ = tiny_engine("llama")
    target = LLM(engine)
    proposer = DraftProposer(engine, target.tokenizer, target.backend.vocab_size, stop_margin=1e9)
    request = SimpleNamespace(prompt_ids=[5, 6, 7, 8, 9, 10], token_ids=[11], sampling=SimpleNamespace(rng=None),
                              params=SamplingParams(max_new_tokens=90, temperature=0))
    for _ in range(3):  # the target goes another way at every near tie: each proposal ends at its first draft
        drafts = proposer.propose(request, 4).tokens
        assert len(drafts) == 1
        request.token_ids.append(5 if drafts[0] != 5 else 6)
    lengths = []
    for _ in range(12):  # now every near tie survives: the proposer learns that stopping there does not pay
        drafts = proposer.propose(request, 4).tokens
        lengths.append(len(drafts))
        request.token_ids += [*drafts, 9]  # all kept, then the target's own token
    assert lengths[0] == 1 and lengths[-1] == 4
    proposer.release(request)

    plain = DraftProposer(engine, target.tokenizer, target.backend.vocab_size)  # no stop_margin: k drafts always
    request.token_ids = [11]
    assert len(plain.propose(request, 4).tokens) == 4
    plain.release(request)
    proposer.close()
    plain.close()
