"""transformers as the numeric reference for a built engine's greedy generation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine_builder import LLM, SamplingParams


def assert_greedy_equals_hf(hf, engine: Path, prompt: list[int], steps: int) -> None:
    """LLM.generate's greedy tokens on the onnxruntime twin equal hf.generate's, their logprobs within 1e-4, and the
    continuation is varied (not one token repeated, which would hide a wrong model)."""
    hf.generation_config.eos_token_id = None  # random weights may emit EOS; compare every step
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=steps, pad_token_id=0,
                           output_logits=True, return_dict_in_generate=True)
    want_tokens = want.sequences[0, len(prompt):].tolist()
    want_logprobs = [float(torch.log_softmax(step[0], -1)[t]) for step, t in zip(want.logits, want_tokens, strict=True)]
    with LLM(engine, backend="onnxruntime") as llm:
        got = llm.generate(prompt_token_ids=[prompt], params=SamplingParams(
            temperature=0, max_new_tokens=steps, ignore_eos=True, logprobs=0))[0]
    assert list(got.token_ids) == want_tokens
    assert len(set(want_tokens)) > steps // 2
    np.testing.assert_allclose([lp.logprob for lp in got.logprobs], want_logprobs, rtol=0, atol=1e-4)
