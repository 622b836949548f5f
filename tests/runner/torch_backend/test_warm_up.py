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


def test_long_prefill_graphs_are_kept_where_they_beat_the_eager_launch_on_cuda(tiny_engine):
    """Past the 256-token buckets the warm-up times each longer bucket's replay against the eager launch of the
    shortest prompt it would take; a 2-layer model of width 64 is launch-bound at any length, so 512 and 1024 stay,
    and a 600-token prompt through the 1024 bucket gets the eager step's logits."""
    import numpy as np

    from engine_builder.runner.core.model_input import ModelInput
    from engine_builder.runner.engine import EngineDir
    from engine_builder.runner.torch_backend.runtime import TorchRuntime

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the trial replays CUDA graphs)")
    engine = tiny_engine("llama", Limits(max_batch=2, max_input_len=1024, max_seq_len=1100))[0]
    backend = TorchRuntime(EngineDir.load(engine), kv_cache_memory=1 << 26)
    try:
        lines: list[str] = []
        backend.warm_up(lines.append)
        assert backend._graphs.prefill_sizes[-2:] == [512, 1024], lines
        assert any(line.startswith("prefill graphs past 256 tokens: 512 kept") for line in lines), lines
        prompt = np.random.default_rng(0).integers(3, 300, (1, 600))
        slot = backend.kv.allocate(0, 600, 8)
        batch = ModelInput.rows(slot, prompt, backend.kv.lengths[slot:slot + 1])
        assert backend._graphs.bucket(batch) == ("prefill", 1024)
        graphed = backend.forward(batch).clone()
        torch.testing.assert_close(graphed, backend._eager(batch), rtol=0, atol=1e-4)
    finally:
        backend.close()
