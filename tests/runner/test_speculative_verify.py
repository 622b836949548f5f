"""The verify step of speculative decoding: k+1 tokens on top of a filled KV cache in one engine call,
logits for every position (graph metadata logits_tail), and rollback of a rejected tail by simply not
advancing the cache length past the accepted tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from runner_engines import GQA_PASSES

from engine_builder.runner.engine import EngineDir
from engine_builder.runner.ort_backend import OrtBackend

PROMPT = [5, 17, 42, 9, 100, 3, 77, 250]
DRAFT = [11, 12, 13, 14, 15]  # the last accepted token + 4 drafts


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_verify_step_gives_every_position_the_logits_of_hf(tiny_engine, arch):
    engine, hf_dir = tiny_engine(arch)
    backend = OrtBackend(EngineDir.load(engine))
    assert backend.logits_tail == 16  # the build's default: verify up to 15 drafts
    kv = backend.kv
    slot = kv.allocate("r", len(PROMPT), 16)
    backend.step(slot, np.array([PROMPT]))
    kv.advance(slot, len(PROMPT))
    backend.bind(slot, np.array([DRAFT]))
    backend.execute()
    got = backend.read_tail_logits()[0].copy()  # [5, vocab]: one row per fed token
    assert got.shape == (len(DRAFT), backend.vocab_size)

    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(torch.tensor([PROMPT + DRAFT])).logits[0, len(PROMPT):].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("passes,mode", [(None, None), (GQA_PASSES, None), (None, "copy")])
def test_a_rejected_tail_never_affects_later_tokens(tiny_engine, passes, mode):
    """Verify [t, a, b, c, d], accept t and a only (advance 2), then go on with other tokens: every later
    logit equals a run that never saw b, c, d (their cache positions lie past the length and are overwritten)."""
    engine, _ = tiny_engine("llama", ort_passes=passes)
    dirs = EngineDir.load(engine)
    later = [[40], [41], [42, 43, 44], [45]]  # decode steps and a second verify on top of the rollback

    def run(first: list[int]) -> list[np.ndarray]:
        backend = OrtBackend(dirs, kv_update=mode)
        kv = backend.kv
        slot = kv.allocate("r", len(PROMPT), 20)
        backend.step(slot, np.array([PROMPT]))
        kv.advance(slot, len(PROMPT))
        backend.step(slot, np.array([first]))
        kv.advance(slot, 2)  # t and a accepted; whatever followed them is rejected
        seen = []
        for ids in later:
            backend.bind(slot, np.array([ids]))
            backend.execute()
            seen.append(backend.read_tail_logits()[0].copy())
            kv.advance(slot, len(ids))
        return seen

    rejected = run([11, 12, 99, 98, 97])  # b, c, d written into the cache, then rejected
    clean = run([11, 12])  # never saw them
    for got, want in zip(rejected, clean):
        np.testing.assert_array_equal(got, want)
