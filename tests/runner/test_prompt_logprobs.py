"""Prompt logprobs (echo + logprobs, lm-eval's loglikelihood) scored logits_tail positions per engine call:
equal to scoring the prompt one token per call, in far fewer engine calls, with the same generated tokens."""

from __future__ import annotations

import numpy as np

from engine_builder import LLM, SamplingParams
from engine_builder.runner.logits_processors import log_softmax

PROMPT = [(7 * i) % 300 + 3 for i in range(30)]  # 30 tokens: two steps of logits_tail 16


class CountedExecute:
    """Counts the backend's engine calls (the real calls still run)."""

    def __init__(self, backend) -> None:
        self.backend, self.calls, self._execute = backend, 0, backend.execute
        backend.execute = self

    def __call__(self) -> None:
        self.calls += 1
        self._execute()


def test_prompt_logprobs_in_tail_sized_steps_equal_one_token_steps(tiny_engine):
    engine, _ = tiny_engine("llama")
    llm = LLM(engine, backend="onnxruntime")
    assert llm.backend.logits_tail == 16
    plain = llm.generate(prompt_token_ids=[PROMPT], params=SamplingParams(max_new_tokens=4, temperature=0))[0]
    counted = CountedExecute(llm.backend)
    out = llm.generate(prompt_token_ids=[PROMPT], params=SamplingParams(max_new_tokens=4, temperature=0,
                                                                         prompt_logprobs=3))[0]
    assert counted.calls == 2 + 3  # ceil(30 / 16) prompt steps, then 3 decode steps: not 30 + 3
    assert out.token_ids == plain.token_ids
    lps = out.prompt_logprobs
    assert len(lps) == len(PROMPT) and lps[0] is None
    backend = llm.backend  # the reference: one token per call, float32 log_softmax of each call's logits
    backend.kv.allocate(0, len(PROMPT), 1)
    try:
        for i in range(len(PROMPT) - 1):
            expected = log_softmax(np.array(backend.step(0, np.asarray([[PROMPT[i]]], np.int64))))[0]
            backend.kv.advance(0, 1)
            got = lps[i + 1]
            assert got.token_id == PROMPT[i + 1]
            assert abs(got.logprob - float(expected[PROMPT[i + 1]])) < 1e-4
            assert got.rank == int((expected > expected[PROMPT[i + 1]]).sum()) + 1
            best = np.argsort(-expected, kind="stable")[:3]
            assert [t for t, _ in got.top] == [int(t) for t in best]
    finally:
        backend.release(0)
