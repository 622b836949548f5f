"""Executor tests run on the session's SmolLM2 fp32 onnxruntime engine (max_batch 4, max_input_len 128,
max_seq_len 256). Each test starts its own Executor on the shared LLM and shuts it down, which gives
the LLM back for the next test."""

from __future__ import annotations

import pytest


@pytest.fixture
def llm(smollm2_llm):
    yield smollm2_llm
    # a test that failed half-way must not leave the shared LLM claimed or its slots held
    assert smollm2_llm.backend.kv.num_free == smollm2_llm.backend.kv.batch_slots
