"""warm_up (serve's start): torch.compile and the attention kernel's variants paid before the first request, over
the scratch block only. On a CPU the layers compile when TRTBUILD_TORCH_COMPILE=on (CUDA graphs need a GPU:
benchmarks/gpu_run.sh runs this file there, where warm_up captures every bucket)."""

from __future__ import annotations

import os

import pytest
import torch

from engine_builder import LLM, SamplingParams
from engine_builder.formats.build_config import Limits
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK

ON_GPU = os.environ.get("TRTBUILD_TEST_DEVICE") == "cuda"
GREEDY = SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=0.0)
PROMPTS = [[1, 5, 9, 33, 7], [1, 8, *range(20, 40)]]


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine("llama", Limits(max_batch=4, max_input_len=32, max_seq_len=96))[0]


def test_warm_up_compiles_before_the_first_request_and_writes_only_scratch(engine, monkeypatch):
    monkeypatch.setenv("TRTBUILD_TORCH_COMPILE", "on")
    torch._dynamo.reset()
    llm = LLM(engine, backend="torch")
    try:
        lines: list[str] = []
        warm = llm.warm_up(lines.append)
        assert warm is not None and warm.compile_seconds > 0 and "torch.compile" in lines[0]
        assert warm.graphs == (llm.backend._graphs.count if ON_GPU else 0)
        for pool in (*llm.backend.keys, *llm.backend.values):
            rest = torch.cat([pool[:SCRATCH_BLOCK], pool[SCRATCH_BLOCK + 1:]])
            assert not rest.any()  # no slot's, no cached prompt's block was written
        compiled = llm.backend.compiled.seconds
        ours = [o.token_ids for o in llm.generate(prompt_token_ids=PROMPTS, params=GREEDY)]
        assert llm.backend.compiled.seconds == compiled  # the requests compiled nothing
    finally:
        llm.close()
    monkeypatch.setenv("TRTBUILD_TORCH_COMPILE", "off")
    eager = LLM(engine, backend="torch")
    try:
        assert ours == [o.token_ids for o in eager.generate(prompt_token_ids=PROMPTS, params=GREEDY)]
        if not ON_GPU:
            assert eager.warm_up() is None  # eager on a CPU: nothing to pay up front
    finally:
        eager.close()


def test_a_host_backend_has_nothing_to_warm(engine):
    llm = LLM(engine, backend="onnxruntime")
    try:
        assert llm.warm_up() is None
    finally:
        llm.close()
