"""A draft model keeps a finished request's slot ("parked") and the next request with the same prefix feeds it only
what differs: real onnxruntime sessions of a tiny Llama drafting for itself (so any wrong cache entry in the reused
slot would show as a rejected draft), greedy tokens equal to plain decoding, parked slots freed when a request
needs one."""

from __future__ import annotations

from engine_builder import LLM, SamplingParams
from engine_builder.runner.speculative import SpeculativeConfig

GREEDY = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
A = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
A_LONGER = [*A, 40, 41, 42]  # A's prefix, then more: a chat's next turn


def test_a_parked_draft_slot_serves_the_next_request_with_its_prefix(tiny_engine):
    engine, _ = tiny_engine("llama")
    plain = LLM(engine)
    llm = LLM(engine, speculative=SpeculativeConfig("draft", draft_engine=str(engine), num_draft_tokens=3))
    proposer = llm.speculation.proposer
    draft = proposer.backend
    fed: list[int] = []  # tokens of each draft engine call, in order
    bind = draft.bind

    def recording_bind(first_slot, input_ids):
        fed.append(input_ids.shape[1])
        return bind(first_slot, input_ids)

    draft.bind = recording_bind
    # the draft first runs after the target's prefill emitted one token: it feeds the prompt and that token.
    # Then as many other prompts as the draft has slots: the last of them frees the oldest parked slot (A's),
    # so A comes back to a fresh slot
    others = [[60 + 10 * i + j for j in range(6)] for i in range(draft.kv.batch_slots)]
    for prompt, first_feed in ((A, len(A) + 1), (A, 1), (A_LONGER, 3 + 1), *((p, 7) for p in others),
                               (A, len(A) + 1)):
        want = plain.generate(prompt_token_ids=[prompt], params=GREEDY)[0].token_ids
        fed.clear()
        got = llm.generate(prompt_token_ids=[prompt], params=GREEDY)[0]
        assert got.token_ids == want
        # or only what the parked slot lacks: A again the emitted token (whose logits start the draft), A_LONGER
        # its 3 new tokens and that one
        assert fed[0] == first_feed, (prompt, fed[:3])
        stats = llm.speculation.stats
        assert stats.acceptance_rate == 1.0, (prompt, stats.to_json())  # drafting for itself off the reused cache
    assert draft.kv.num_free + len(proposer._parked) == draft.kv.batch_slots
    proposer.forget_parked()  # every slot free again: A is fed whole
    assert not proposer._parked and draft.kv.num_free == draft.kv.batch_slots
    fed.clear()
    assert llm.generate(prompt_token_ids=[A], params=GREEDY)[0].token_ids == plain.generate(
        prompt_token_ids=[A], params=GREEDY)[0].token_ids
    assert fed[0] == len(A) + 1, fed[:3]


def test_parking_off_frees_the_slot(tiny_engine):
    engine, _ = tiny_engine("llama")
    llm = LLM(engine, speculative=SpeculativeConfig("draft", draft_engine=str(engine), num_draft_tokens=3))
    proposer = llm.speculation.proposer
    proposer.park = False
    llm.generate(prompt_token_ids=[A], params=GREEDY)
    assert not proposer._parked and proposer.backend.kv.num_free == proposer.backend.kv.batch_slots
